//! What of the host service needs a process of its own: this test binary run again as one
//! child test, a task or the service, to be killed; another user's process; garbage on the
//! service's socket; a task whose threads are counted.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use super::*;

/// Set in a child: what it is to do. Child tests return at once without it.
const CHILD: &str = "CREDITFLOW_HOST_TEST_CHILD";

/// Runs this test binary again as the child test `test` (its full path), with `vars`.
pub(super) fn child(test: &str, vars: &[(&str, String)]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .envs(vars.iter().map(|(k, v)| (*k, v.clone())))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// Reads the child's output until a line holding `prefix` (the test harness may have written
/// the test's name before it on the same line); returns what follows it.
pub(super) fn expect_line(out: &mut BufReader<std::process::ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended before {prefix:?}"
        );
        if let Some(at) = line.find(prefix) {
            return line[at + prefix.len()..].trim_end().to_string();
        }
    }
}

pub(super) fn kill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

/// Child: a task that attaches to `SERVICE`, writes 5 batches of `ROWS` rows into partition
/// `PARTITION` (and holds a gate reading from `SILENT`, which never answers: a reservation
/// of its own), says so, and waits to be killed.
#[test]
#[ignore = "run by a_killed_task_fails_its_partitions_readers_and_its_reservations_go"]
fn child_task() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = Attachment::connect(&std::env::var("SERVICE").unwrap(), 0, TASK_MEMORY).unwrap();
    let p = a
        .create_partition(&std::env::var("PARTITION").unwrap(), 1, None, None)
        .unwrap();
    let _gate = a
        .create_input_gate(specs(&std::env::var("SILENT").unwrap(), "x", 1))
        .unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let rows: usize = std::env::var("ROWS").unwrap().parse().unwrap();
    for i in 0..5 {
        w.write(&batch(i * rows as i64, rows, 4), &mut forever()).unwrap();
    }
    w.flush(&mut forever()).unwrap();
    println!("WROTE");
    std::thread::sleep(Duration::from_secs(600));
}

/// Child: a task that attaches to `SERVICE`, reads two batches of partition `PARTITION` and
/// holds them, says so, and waits to be killed.
#[test]
#[ignore = "run by pieces_a_killed_reader_held_or_never_read_go_back_to_the_writer_s_heap"]
fn child_reader() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = Attachment::connect(&std::env::var("SERVICE").unwrap(), 0, TASK_MEMORY).unwrap();
    let mut g = a
        .create_input_gate(specs(a.address(), &std::env::var("PARTITION").unwrap(), 1))
        .unwrap();
    let held: Vec<RecordBatch> = (0..2).map(|_| g.next(&mut forever()).unwrap().unwrap()).collect();
    println!("HOLDING {}", held.len());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_task_fails_its_partitions_readers_and_its_reservations_go() {
    let s = service("taskkill", 16 << 20);
    let before = s.metrics().segments_reserved;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (mut task, mut out) = child(
        "host::tests::processes::child_task",
        &[
            ("SERVICE", s.name().into()),
            ("PARTITION", "k".into()),
            ("SILENT", silent.local_addr().unwrap().to_string()),
            ("ROWS", "1000".into()),
        ],
    );
    expect_line(&mut out, "WROTE");
    let with_task = s.metrics().segments_reserved;
    assert_eq!(
        with_task,
        before + 2 + 3,
        "the partition's and the gate's minimums"
    );
    let reader = attach(&s);
    let mut g = reader.create_input_gate(specs(s.address(), "k", 1)).unwrap();
    let mut rows = 0;
    while rows < 5000 {
        rows += g.next(&mut forever()).unwrap().unwrap().num_rows();
    }
    let pid = format!("pid {}", task.id());
    kill(&mut task);
    let killed = Instant::now();
    // The session's end or the writer's link breaking, whichever the service sees first.
    let err = g.next(&mut forever()).unwrap_err();
    assert!(
        matches!(&err, Error::ProducerFailed(m) if m.contains(&pid)),
        "{err}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "{:?}",
        killed.elapsed()
    );
    // The gate's reservation goes with the task; the partition's once its reader is done.
    drop(g);
    wait_until(
        || s.metrics().segments_reserved == before,
        "the task's reservations to go",
    );
}

/// Child: a task that writes `BATCHES` small batches into a partition of `SERVICE` and reads
/// each from a gate of its own before it writes the next (the service sleeps in between, so
/// every write rings it and every batch rings the gate), then says how often its attach I/O
/// thread was switched to meanwhile.
#[test]
#[ignore = "run by the_i_o_thread_of_a_task_sleeps_while_its_batches_come_and_go"]
fn child_wakes() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let a = Attachment::connect(&std::env::var("SERVICE").unwrap(), 0, TASK_MEMORY).unwrap();
    let p = a.create_partition("w", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = a.create_input_gate(specs(a.address(), "w", 1)).unwrap();
    // The first batch brings the schema and the link's heap over.
    w.write(&batch(0, 10, 4), &mut forever()).unwrap();
    w.flush(&mut forever()).unwrap();
    assert_eq!(g.next(&mut forever()).unwrap().unwrap().num_rows(), 10);
    let io = attach_thread_switches();
    let batches: usize = std::env::var("BATCHES").unwrap().parse().unwrap();
    for i in 0..batches {
        w.write(&batch(i as i64, 10, 4), &mut forever()).unwrap();
        w.flush(&mut forever()).unwrap();
        assert_eq!(g.next(&mut forever()).unwrap().unwrap().num_rows(), 10);
    }
    println!("SWITCHES {}", attach_thread_switches() - io);
}

/// How often this process's attach I/O thread has been switched to (voluntarily or not).
fn attach_thread_switches() -> u64 {
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        if std::fs::read_to_string(dir.join("comm")).unwrap().trim() != "creditflow-atta" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        return status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .map(|l| l.rsplit('\t').next().unwrap().trim().parse::<u64>().unwrap())
            .sum();
    }
    panic!("no attach I/O thread in this process")
}

#[test]
fn the_i_o_thread_of_a_task_sleeps_while_its_batches_come_and_go() {
    // A gate's caller is woken by the service's doorbell itself, and ringing the service
    // does not wake the ringing side's thread: the task's I/O thread has nothing to do for
    // batches (it used to wake about twice per batch).
    let s = service("wakes", 16 << 20);
    const BATCHES: u64 = 200;
    let (mut task, mut out) = child(
        "host::tests::processes::child_wakes",
        &[("SERVICE", s.name().into()), ("BATCHES", BATCHES.to_string())],
    );
    let switches: u64 = expect_line(&mut out, "SWITCHES ").parse().unwrap();
    assert!(task.wait().unwrap().success());
    assert!(
        switches < BATCHES / 10,
        "the attach I/O thread was switched to {switches} times for {BATCHES} batches"
    );
}

/// Child: a service named `SERVICE` (spilling into `SPILL`), which says its address and runs
/// until killed.
#[test]
#[ignore = "run by the tests that kill a service"]
fn child_service() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let mut c = config(&std::env::var("SERVICE").unwrap(), 1 << 20);
    c.env.spill_dir = std::env::var("SPILL").ok().map(Into::into);
    let s = HostService::start(c).unwrap();
    println!("ADDRESS {}", s.address());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_service_fails_every_attached_task_within_two_seconds_and_a_new_one_takes_over() {
    let name = unique("servicekill");
    let (mut svc, mut out) = child(
        "host::tests::processes::child_service",
        &[("SERVICE", name.clone())],
    );
    let address = expect_line(&mut out, "ADDRESS ");
    let (a, b) = (
        Attachment::connect(&name, 0, TASK_MEMORY).unwrap(),
        Attachment::connect(&name, 0, TASK_MEMORY).unwrap(),
    );
    // One task blocked reading a partition nobody writes, one writing into a full one.
    let mut g = b.create_input_gate(specs(&address, "never", 1)).unwrap();
    let reading = std::thread::spawn(move || {
        let r = g.next(&mut forever());
        (r.map(|b| b.is_some()), Instant::now())
    });
    let p = a.create_partition("full", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let writing = std::thread::spawn(move || loop {
        if let Err(e) = w.write(&batch(0, 10_000, 16), &mut forever()) {
            return (e, Instant::now());
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    kill(&mut svc);
    let killed = Instant::now();
    let (read, read_at) = reading.join().unwrap();
    let (write_err, write_at) = writing.join().unwrap();
    assert!(matches!(read, Err(Error::ConnectionLost(_))), "{read:?}");
    assert!(matches!(write_err, Error::ConnectionLost(_)), "{write_err}");
    for at in [read_at, write_at] {
        assert!(at.saturating_duration_since(killed) < Duration::from_secs(2));
    }
    // Every later call fails too, at once.
    assert!(matches!(p.flush(), Err(Error::ConnectionLost(_))));
    assert!(a.ended().is_some());
    // The name is free: a new service starts and tasks attach to it.
    let s = HostService::start(config(&name, 4 << 20)).unwrap();
    let c = Attachment::connect(&name, 0, TASK_MEMORY).unwrap();
    assert_eq!(c.service_pid(), std::process::id());
    drop(s);
}

#[test]
fn a_new_service_removes_what_a_killed_one_left_on_disk() {
    let spill = tempfile::tempdir().unwrap();
    let name = unique("leftovers");
    let vars = [
        ("SERVICE", name.clone()),
        ("SPILL", spill.path().display().to_string()),
    ];
    let (mut svc, mut out) = child("host::tests::processes::child_service", &vars);
    expect_line(&mut out, "ADDRESS ");
    let a = Attachment::connect(&name, 0, TASK_MEMORY).unwrap();
    // 1 MiB of memory: a blocking partition of 8 MB spills.
    let p = a
        .create_partition("spilled", 1, Some(SpillKind::Blocking), None)
        .unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    for i in 0..40 {
        w.write(&batch(i * 10_000, 10_000, 16), &mut forever()).unwrap();
    }
    w.close(&mut forever()).unwrap();
    let files = || {
        walk(spill.path())
            .into_iter()
            .filter(|p| !p.to_string_lossy().ends_with(".lock"))
            .count()
    };
    assert!(files() > 1, "the partition spilled");
    kill(&mut svc);
    drop((w, p, a));
    let mut c = config(&name, 4 << 20);
    c.env.spill_dir = Some(spill.path().to_path_buf());
    let s = HostService::start(c).unwrap();
    // Only the new service's own (empty) directory is left.
    assert_eq!(files(), 1, "{:?}", walk(spill.path()));
    drop(s);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Child: connects to the abstract socket `SOCKET` (another user's service) and sends an
/// attach; says whether it was welcomed.
#[test]
#[ignore = "run by another_users_process_cannot_attach"]
fn child_other_user() {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    if std::env::var(CHILD).is_err() {
        return;
    }
    let name = std::env::var("SOCKET").unwrap();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let mut sock = match std::os::unix::net::UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e) => return println!("RESULT cannot connect: {e}"),
    };
    let pid = std::process::id();
    let _ = sock.write_all(&super::codec::Opening::Attach { pid, owner: 0 }.encode());
    let mut answer = Vec::new();
    let _ = sock.read_to_end(&mut answer);
    println!("RESULT answered {} bytes", answer.len());
}

#[test]
fn another_users_process_cannot_attach() {
    use std::os::unix::process::CommandExt;
    if rustix::process::getuid().as_raw() != 0 {
        // Only root can run a child as another user.
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let s = service("users", 4 << 20);
    let socket = super::name::socket_name(s.name());
    // The other user runs a copy of this binary from a directory it may enter (the build's
    // own may be private to root, as a `mktemp -d` clone is).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("child");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .args([
            "--exact",
            "host::tests::processes::child_other_user",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("SOCKET", &socket[1..])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let result = text
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or("no result");
    // It reaches the socket, and is closed on without a word.
    assert_eq!(result, "answered 0 bytes", "{text}");
    assert_eq!(s.metrics().sessions, 0);
}

/// A raw connection to the service's socket, as a process with a bug would make.
fn raw(s: &HostService) -> std::os::unix::net::UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let name = super::name::socket_name(s.name());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name.as_bytes()[1..]).unwrap();
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    sock
}

/// Everything the service says until it closes the connection (a read timeout fails). A
/// close that leaves some of our bytes unread resets the connection after what it wrote.
fn until_closed(mut sock: std::os::unix::net::UnixStream) -> Vec<u8> {
    use std::io::Read;
    let mut said = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return said,
            Ok(n) => said.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return said,
            Err(e) => panic!("the service did not close the connection: {e}"),
        }
    }
}

#[test]
fn garbage_on_the_service_s_socket_is_refused_and_the_service_serves_on() {
    use std::io::Write;
    let s = service("garbage", 16 << 20);
    let refused = |said: &[u8]| said.len() > codec::FRAME_HEADER && said[4] == codec::ty::REFUSED;
    // An opening of an unknown type, one too long, and bytes that are no frame at all.
    for bytes in [
        codec::frame(99, |o| o.u64(1)),
        [&u32::MAX.to_le_bytes()[..], &[codec::ty::ATTACH]].concat(),
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        let mut sock = raw(&s);
        sock.write_all(&bytes).unwrap();
        assert!(refused(&until_closed(sock)), "{bytes:?} was not refused");
    }
    // A link for a session that does not exist.
    let mut sock = raw(&s);
    sock.write_all(
        &codec::Opening::Link {
            session: 999,
            link: 1,
        }
        .encode(),
    )
    .unwrap();
    let said = until_closed(sock);
    assert!(refused(&said));
    let mut i = codec::In::new(&said[codec::FRAME_HEADER..]);
    assert!(matches!(
        codec::get_error(&mut i).unwrap(),
        Error::Authentication(_)
    ));
    // A session that attaches properly, then sends garbage: that session ends, nothing else.
    let task = attach(&s);
    let mut sock = raw(&s);
    let opening = codec::Opening::Attach {
        pid: std::process::id(),
        owner: 0,
    };
    sock.write_all(&opening.encode()).unwrap();
    wait_until(|| s.metrics().sessions == 2, "the raw session");
    sock.write_all(&codec::frame(codec::ty::REQUEST, |o| {
        o.u64(1);
        o.u8(200);
    }))
    .unwrap();
    let said = until_closed(sock);
    assert_eq!(
        said[4],
        codec::ty::WELCOME,
        "the session was welcomed, then ended"
    );
    wait_until(|| s.metrics().sessions == 1, "the raw session to end");
    // The service and the other session carry on.
    let p = task.create_partition("after", 1, None, None).unwrap();
    let mut w = p.writer(Partitioner::Forward).unwrap();
    let mut g = task.create_input_gate(specs(s.address(), "after", 1)).unwrap();
    w.write(&batch(0, 100, 4), &mut forever()).unwrap();
    w.close(&mut forever()).unwrap();
    assert_eq!(drain(&mut g)[&0], (0..100).collect::<Vec<i64>>());
}
