//! The stable counting sort of a batch's rows by partition id that a hash split is made from.
//!
//! A plain counting sort increments one counter per row, and with few partitions the next row
//! often increments the same counter again (with two, every other row): it then waits for the
//! store before it (store to load forwarding, several cycles). With fewer than
//! [`FEW_PARTITIONS`] partitions the rows are cut into [`LANES`] consecutive runs, each with
//! its own counters and cursors, and the loops step through the runs side by side, so
//! consecutive increments touch different counters. With more partitions consecutive rows
//! seldom share a counter, and four times the cursors to write through cost more than they
//! save, so they are sorted in one run. Either way the result is the plain sort's: the rows of
//! a partition in input order (run by run, and the runs are in input order).

/// How many runs the rows are cut into when there are few partitions.
const LANES: usize = 4;

/// Below this many partitions, the rows are sorted in [`LANES`] runs.
const FEW_PARTITIONS: usize = 4;

/// Sorts the row indices `0..ids.len()` by `ids` (each `< n`), stably: afterwards rows
/// `order[offsets[p]..offsets[p + 1]]` are partition `p`'s, in input order. `lanes` is scratch
/// space. Returns `Some(p)` and leaves `order` as it was when every row has id `p` (then
/// `offsets` is still filled).
pub(crate) fn order_rows(
    ids: &[u32],
    n: usize,
    offsets: &mut Vec<usize>,
    order: &mut Vec<u32>,
    lanes: &mut Vec<usize>,
) -> Option<usize> {
    if n < FEW_PARTITIONS {
        order_in_runs::<LANES>(ids, n, offsets, order, lanes)
    } else {
        order_in_runs::<1>(ids, n, offsets, order, lanes)
    }
}

/// [`order_rows`] with the rows cut into `RUNS` runs (a constant, so that the loops over the
/// runs unroll).
fn order_in_runs<const RUNS: usize>(
    ids: &[u32],
    n: usize,
    offsets: &mut Vec<usize>,
    order: &mut Vec<u32>,
    lanes: &mut Vec<usize>,
) -> Option<usize> {
    let rows = ids.len();
    let run = rows / RUNS;
    // Counts per run: run l is rows l*run..(l+1)*run; the last also takes the rows past
    // RUNS*run (fewer than RUNS).
    lanes.clear();
    lanes.resize(RUNS * n, 0);
    for j in 0..run {
        for l in 0..RUNS {
            lanes[l * n + ids[l * run + j] as usize] += 1;
        }
    }
    for &id in &ids[RUNS * run..] {
        lanes[(RUNS - 1) * n + id as usize] += 1;
    }
    // Each partition's start, then each run's cursor within it, in row order.
    offsets.clear();
    offsets.resize(n + 1, 0);
    let mut at = 0;
    let mut whole = None;
    for p in 0..n {
        offsets[p] = at;
        for l in 0..RUNS {
            let count = lanes[l * n + p];
            lanes[l * n + p] = at;
            at += count;
        }
        if at - offsets[p] == rows && rows > 0 {
            whole = Some(p);
        }
    }
    offsets[n] = at;
    if whole.is_some() {
        return whole;
    }
    order.clear();
    order.resize(rows, 0);
    for j in 0..run {
        for l in 0..RUNS {
            let row = l * run + j;
            let cursor = &mut lanes[l * n + ids[row] as usize];
            order[*cursor] = row as u32;
            *cursor += 1;
        }
    }
    for (row, &id) in ids.iter().enumerate().skip(RUNS * run) {
        let cursor = &mut lanes[(RUNS - 1) * n + id as usize];
        order[*cursor] = row as u32;
        *cursor += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plain stable counting sort, one counter per partition.
    fn plain(ids: &[u32], n: usize) -> (Vec<usize>, Vec<u32>) {
        let mut offsets = vec![0; n + 1];
        for &id in ids {
            offsets[id as usize + 1] += 1;
        }
        for p in 1..=n {
            offsets[p] += offsets[p - 1];
        }
        let mut cursor = offsets.clone();
        let mut order = vec![0; ids.len()];
        for (row, &id) in ids.iter().enumerate() {
            order[cursor[id as usize]] = row as u32;
            cursor[id as usize] += 1;
        }
        (offsets, order)
    }

    proptest! {
        #[test]
        fn rows_are_ordered_as_a_plain_counting_sort_orders_them(
            (n, ids) in (1usize..40).prop_flat_map(|n| (Just(n), prop::collection::vec(0..n as u32, 0..300)))
        ) {
            let (want_offsets, want_order) = plain(&ids, n);
            let (mut offsets, mut order, mut lanes) = (Vec::new(), vec![7; 3], Vec::new());
            let whole = order_rows(&ids, n, &mut offsets, &mut order, &mut lanes);
            prop_assert_eq!(&offsets, &want_offsets);
            let one = (0..n).find(|&p| !ids.is_empty() && want_offsets[p + 1] - want_offsets[p] == ids.len());
            prop_assert_eq!(whole, one);
            if whole.is_none() {
                prop_assert_eq!(order, want_order);
            }
        }
    }

    #[test]
    fn scratch_space_from_a_larger_split_does_not_leak_into_a_smaller_one() {
        let (mut offsets, mut order, mut lanes) = (Vec::new(), Vec::new(), Vec::new());
        let many: Vec<u32> = (0..1000).map(|i| (i * 7 % 13) as u32).collect();
        order_rows(&many, 13, &mut offsets, &mut order, &mut lanes);
        let few = [1, 0, 1, 1, 0, 0, 1];
        assert_eq!(order_rows(&few, 2, &mut offsets, &mut order, &mut lanes), None);
        assert_eq!(offsets, vec![0, 3, 7]);
        assert_eq!(order, vec![1, 4, 5, 0, 2, 3, 6]);
        assert_eq!(
            order_rows(&[1, 1, 1], 3, &mut offsets, &mut order, &mut lanes),
            Some(1)
        );
        assert_eq!(offsets, vec![0, 0, 3, 3]);
    }
}
