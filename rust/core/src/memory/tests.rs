//! Tests of the pools: unit tests, a property test against a model, and a loom model.

#[cfg(not(loom))]
mod unit {
    use crate::base::error::Error;
    use crate::base::wait::Wait;
    use crate::memory::*;
    use std::time::Duration;

    const SEG: usize = 4096;

    fn no_wait() -> Wait<'static> {
        Wait::timeout(Some(Duration::from_millis(20)), "test")
    }

    #[test]
    fn global_pool_allocates_lazily_up_to_the_cap() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        assert_eq!(g.total_segments(), 10);
        assert_eq!(g.allocated_segments(), 0);
        let p = g.create_local_pool("p", 1, usize::MAX, "").unwrap();
        let segs = p.request_many(4, &mut no_wait()).unwrap();
        assert_eq!(g.allocated_segments(), 4);
        let more = p.request_many(6, &mut no_wait()).unwrap();
        assert_eq!(g.allocated_segments(), 10);
        assert!(p.try_request().is_none(), "the cap holds");
        drop((segs, more));
        assert_eq!(p.stats().in_use, 0);
    }

    #[test]
    fn memory_held_outside_shrinks_shares_drops_free_segments_and_comes_back() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let p = g.create_local_pool("p", 2, usize::MAX, "").unwrap();
        let segs = p.request_many(8, &mut no_wait()).unwrap();
        drop(segs); // recycled into p's free list: 8 segments allocated
        assert_eq!(g.allocated_segments(), 8);
        let held = g.hold_outside("window", 6, "").unwrap();
        assert_eq!(p.stats().share, 4, "the pool's share shrinks by what is held");
        assert!(
            g.allocated_segments() + held.segments() <= 10,
            "free segments beyond the rest are dropped: {} allocated",
            g.allocated_segments()
        );
        let in_use = p.request_many(4, &mut no_wait()).unwrap();
        assert!(p.try_request().is_none(), "the pool stays within its share");
        assert_eq!(g.available_segments(), 0);
        assert!(
            g.hold_outside("more", 3, "").is_err(),
            "the pools' minimums are not given away"
        );
        drop(in_use);
        drop(held);
        assert_eq!(p.stats().share, 10, "given back");
        assert_eq!(g.reserved_segments(), 2);
        assert_eq!(p.request_many(10, &mut no_wait()).unwrap().len(), 10);
    }

    #[test]
    fn insufficient_minimum_fails_at_construction_with_numbers() {
        let g = GlobalPool::new(8 * SEG, SEG).unwrap();
        let _a = g.create_local_pool("a", 5, usize::MAX, "").unwrap();
        let err = g
            .create_local_pool("gate b", 4, usize::MAX, "increase memory")
            .unwrap_err();
        match err {
            Error::InsufficientBuffers {
                required,
                available,
                total,
                ref hint,
                ..
            } => {
                assert_eq!((required, available, total), (4, 3, 8));
                assert_eq!(hint, "increase memory");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn shares_are_redistributed_on_create_and_destroy() {
        let g = GlobalPool::new(100 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 10, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 100);
        let b = g.create_local_pool("b", 20, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 10 + 35);
        assert_eq!(b.stats().share, 20 + 35);
        let c = g.create_local_pool("c", 0, 5, "").unwrap();
        assert_eq!(c.stats().share, 5, "capped at max; the rest goes to the others");
        assert_eq!(a.stats().share + b.stats().share + c.stats().share, 100);
        drop(b);
        assert_eq!(a.stats().share + c.stats().share, 100);
        assert_eq!(c.stats().share, 5);
    }

    #[test]
    fn recycled_segments_above_the_share_go_back_to_the_global_pool() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 2, usize::MAX, "").unwrap();
        let segs = a.request_many(10, &mut no_wait()).unwrap();
        assert_eq!(g.available_segments(), 0);
        let b = g.create_local_pool("b", 2, usize::MAX, "").unwrap();
        assert_eq!(a.stats().share, 5);
        // b's minimum is guaranteed even though a holds everything right now: a must give
        // back as it recycles.
        assert!(b.try_request().is_none());
        drop(segs);
        assert_eq!(a.stats().held, 5, "a keeps only its share");
        assert_eq!(b.request_many(4, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn one_more_segment_beyond_a_held_over_share_and_back_when_recycled() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 2, usize::MAX, "").unwrap();
        let mut held = a.request_many(10, &mut no_wait()).unwrap();
        let b = g.create_local_pool("b", 2, usize::MAX, "").unwrap();
        drop(held.drain(..3).collect::<Vec<_>>()); // a holds 7, its share is 5
        assert_eq!((a.stats().held, a.stats().share), (7, 5));
        assert!(a.try_request().is_none());
        assert!(a.try_request_overdraft().is_none(), "overdraft is off");
        let extra = a.try_request_one_more().expect("one beyond what it holds");
        assert_eq!(a.stats().held, 8);
        // Never another pool's minimum: b's 2 stay free for b.
        assert_eq!(g.available_segments(), 2);
        let more: Vec<_> = (0..3).filter_map(|_| a.try_request_one_more()).collect();
        assert_eq!(more.len(), 0, "b's minimum is not lent");
        drop(extra);
        assert_eq!(
            a.stats().held,
            7,
            "recycled above the share: back to the global pool"
        );
        assert_eq!(b.request_many(2, &mut no_wait()).unwrap().len(), 2);
    }

    #[test]
    fn a_pool_cannot_take_another_pools_minimum() {
        let g = GlobalPool::new(10 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, 8, "").unwrap();
        let b = g.create_local_pool("b", 4, 4, "").unwrap();
        // a's share is 6 (1 + the 5 unreserved); b's 4 are protected.
        let held = a.request_many(6, &mut no_wait()).unwrap();
        assert_eq!(held.len(), 6);
        assert_eq!(b.request_many(4, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn oversized_requests_are_clamped_to_the_share() {
        let g = GlobalPool::new(4 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        assert_eq!(a.request_many(100, &mut no_wait()).unwrap().len(), 4);
    }

    #[test]
    fn blocked_request_times_out_and_wakes_on_recycle() {
        let g = GlobalPool::new(2 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let held = a.request_many(2, &mut no_wait()).unwrap();
        assert!(matches!(a.request(&mut no_wait()), Err(Error::Timeout(..))));
        std::thread::scope(|s| {
            let h = s.spawn(|| a.request(&mut Wait::timeout(Some(Duration::from_secs(10)), "t")));
            std::thread::sleep(Duration::from_millis(30));
            drop(held);
            assert!(h.join().unwrap().is_ok());
        });
    }

    #[test]
    fn destroy_returns_free_segments_and_fails_waiters() {
        let g = GlobalPool::new(4 * SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let s = a.request_many(3, &mut no_wait()).unwrap();
        drop(s);
        assert_eq!(g.available_segments(), 1);
        a.destroy();
        assert_eq!(g.available_segments(), 4);
        assert!(matches!(a.request(&mut no_wait()), Err(Error::Closed(_))));
    }

    #[test]
    fn interrupt_check_aborts_a_wait() {
        let g = GlobalPool::new(SEG, SEG).unwrap();
        let a = g.create_local_pool("a", 1, usize::MAX, "").unwrap();
        let _held = a.request(&mut no_wait()).unwrap();
        let mut calls = 0;
        let mut check = || {
            calls += 1;
            if calls > 2 {
                Err(Error::Interrupted)
            } else {
                Ok(())
            }
        };
        let mut wait = Wait::timeout(None, "t").with_check(&mut check);
        assert!(matches!(a.request(&mut wait), Err(Error::Interrupted)));
    }
}

#[cfg(not(loom))]
mod proptests {
    use crate::base::error::Error;
    use crate::memory::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Create { min: usize, max: usize },
        Destroy(usize),
        Request { pool: usize, n: usize },
        Recycle { pool: usize, n: usize },
        Overdraft { pool: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..6, 0usize..20).prop_map(|(min, extra)| Op::Create {
                min,
                max: min + extra
            }),
            (0usize..8).prop_map(Op::Destroy),
            (0usize..8, 1usize..8).prop_map(|(pool, n)| Op::Request { pool, n }),
            (0usize..8, 1usize..8).prop_map(|(pool, n)| Op::Recycle { pool, n }),
            (0usize..8).prop_map(|pool| Op::Overdraft { pool }),
        ]
    }

    proptest! {
        /// Whatever happens, no more than `total` segments exist, every segment is accounted
        /// for exactly once, and minimums never exceed the total.
        #[test]
        fn segments_are_conserved_and_capped(ops in proptest::collection::vec(op(), 1..80)) {
            let g = GlobalPool::new(24 * 4096, 4096).unwrap();
            let mut pools: Vec<(LocalPool, Vec<PooledSegment>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Create { min, max } => {
                        let reserved = g.reserved_segments();
                        match g.create_local_pool("p", min, max, "") {
                            Ok(p) => pools.push((p, Vec::new())),
                            Err(Error::InsufficientBuffers { .. }) => prop_assert!(reserved + min > 24),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::Destroy(i) if i < pools.len() => { pools.remove(i); }
                    Op::Request { pool, n } if pool < pools.len() => {
                        if let Some(segs) = pools[pool].0.try_request_many(n) {
                            pools[pool].1.extend(segs);
                        }
                    }
                    Op::Overdraft { pool } if pool < pools.len() => {
                        pools[pool].0.set_overdraft(3);
                        let before = pools[pool].0.stats();
                        match pools[pool].0.try_request_overdraft() {
                            Some(seg) => {
                                prop_assert!(before.in_use < before.share.max(1) + 3);
                                pools[pool].1.push(seg);
                            }
                            // Refused only at the limit, or when the global pool has nothing
                            // to lend beyond other pools' unmet minimums.
                            None => {
                                let unmet_others: usize = pools
                                    .iter()
                                    .enumerate()
                                    .filter(|(i, _)| *i != pool)
                                    .map(|(_, (p, _))| p.stats().min.saturating_sub(p.stats().held))
                                    .sum();
                                prop_assert!(
                                    before.held >= before.share.max(1) + 3
                                        || g.available_segments() <= unmet_others,
                                    "refused below the limit with {} free and {} unmet",
                                    g.available_segments(),
                                    unmet_others
                                );
                            }
                        }
                    }
                    Op::Recycle { pool, n } if pool < pools.len() => {
                        let v = &mut pools[pool].1;
                        let keep = v.len().saturating_sub(n);
                        v.truncate(keep);
                    }
                    _ => {}
                }
                prop_assert!(g.allocated_segments() <= 24);
                let held: usize = pools.iter().map(|(p, _)| p.stats().held).sum();
                prop_assert_eq!(held + g.available_segments(), 24);
                let in_use: usize = pools.iter().map(|(_, v)| v.len()).sum();
                let stats_in_use: usize = pools.iter().map(|(p, _)| p.stats().in_use).sum();
                prop_assert_eq!(in_use, stats_in_use);
                let shares: usize = pools.iter().map(|(p, _)| p.stats().share).sum();
                prop_assert!(shares <= 24);
            }
            drop(pools);
            prop_assert_eq!(g.available_segments(), 24);
        }
    }
}

#[cfg(loom)]
mod loom_tests {
    use crate::base::sync::Arc;
    use crate::memory::*;

    /// Two threads compete for one segment while the holder recycles it: nobody loses a
    /// segment and both requests eventually succeed.
    #[test]
    fn loom_pool_request_and_recycle() {
        loom::model(|| {
            let g = GlobalPool::new(4096, 4096).unwrap();
            let p = Arc::new(g.create_local_pool("p", 1, 1, "").unwrap());
            let first = p.try_request().unwrap();
            let p2 = p.clone();
            let t = loom::thread::spawn(move || {
                let s = p2.try_request();
                drop(s);
            });
            drop(first);
            t.join().unwrap();
            assert_eq!(p.stats().in_use, 0);
            assert_eq!(p.stats().held + g.available_segments(), 1);
        });
    }
}
