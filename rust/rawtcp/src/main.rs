//! `creditflow-rawtcp`: the raw-TCP ceiling of the remote benchmarks (`benches/`).
//!
//! One process streams bytes to another over loopback TCP with 1 MiB writes from a
//! pre-filled buffer, and the other reads them into a 1 MiB buffer: no framing, no
//! serialization, no flow control beyond TCP's own. std only.
//!
//! ```text
//! creditflow-rawtcp serve <bytes>   bind 127.0.0.1:0, print the port, accept one connection,
//!                                   write <bytes> in 1 MiB writes, close
//! creditflow-rawtcp recv <addr>     connect, read to EOF, print {"bytes", "seconds", ...} as JSON
//! creditflow-rawtcp bench <bytes>   both: runs `serve` as a child process, then `recv` against it
//! ```
//!
//! The time is from the moment the connection is established to end of stream. The data is
//! touched: the receiver checks one byte per 4 KiB against the pattern the server writes
//! (`offset % 1 MiB % 251`), so neither side can be optimized away and a short or corrupt
//! stream fails.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

/// Size of every write and of the receive buffer.
const CHUNK: usize = 1 << 20;
/// The receiver checks the byte at every multiple of this stream offset.
const PROBE: u64 = 4096;

const USAGE: &str = "usage: creditflow-rawtcp serve <bytes> | recv <host:port> | bench <bytes>";

/// The byte the server writes at stream offset `offset`.
fn pattern(offset: u64) -> u8 {
    // The remainder is < 251, so the cast is lossless.
    ((offset % CHUNK as u64) % 251) as u8
}

fn chunk() -> Vec<u8> {
    (0..CHUNK as u64).map(pattern).collect()
}

/// Accepts one connection on `listener` and writes `bytes` bytes to it in 1 MiB writes.
fn serve(listener: &TcpListener, bytes: u64) -> io::Result<()> {
    let buf = chunk();
    let (mut stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let mut left = bytes;
    while left > 0 {
        // `n` is at most CHUNK, so it fits in usize.
        let n = left.min(CHUNK as u64) as usize;
        stream.write_all(&buf[..n])?;
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)
}

struct Received {
    bytes: u64,
    seconds: f64,
    probes: u64,
}

/// Connects to `addr` and reads to end of stream, checking one byte per 4 KiB.
fn recv(addr: &str) -> io::Result<Received> {
    let mut stream = TcpStream::connect(addr)?;
    let start = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    let mut probes = 0u64;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let end = offset + n as u64;
        let mut probe = offset.next_multiple_of(PROBE);
        while probe < end {
            // `probe - offset` < n <= CHUNK, so it fits in usize.
            let got = buf[(probe - offset) as usize];
            if got != pattern(probe) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("byte at offset {probe} is {got}, expected {}", pattern(probe)),
                ));
            }
            probes += 1;
            probe += PROBE;
        }
        offset = end;
    }
    Ok(Received {
        bytes: offset,
        seconds: start.elapsed().as_secs_f64(),
        probes,
    })
}

fn print_received(r: &Received) {
    let gbps = if r.seconds > 0.0 {
        r.bytes as f64 / r.seconds / 1e9
    } else {
        0.0
    };
    println!(
        "{{\"bytes\": {}, \"seconds\": {:.9}, \"gb_per_s\": {:.6}, \"probes\": {}}}",
        r.bytes, r.seconds, gbps, r.probes
    );
}

fn parse_bytes(arg: Option<&String>) -> Result<u64, String> {
    let arg = arg.ok_or(USAGE)?;
    arg.parse()
        .map_err(|_| format!("not a byte count: {arg:?}\n{USAGE}"))
}

fn run(args: &[String]) -> Result<(), String> {
    let err = |e: io::Error| e.to_string();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let bytes = parse_bytes(args.get(1))?;
            let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
            println!("{}", listener.local_addr().map_err(err)?.port());
            io::stdout().flush().map_err(err)?;
            serve(&listener, bytes).map_err(err)
        }
        Some("recv") => {
            let addr = args.get(1).ok_or(USAGE)?;
            print_received(&recv(addr).map_err(err)?);
            Ok(())
        }
        Some("bench") => {
            let bytes = parse_bytes(args.get(1))?;
            let exe = std::env::current_exe().map_err(err)?;
            let mut child = Command::new(exe)
                .args(["serve", &bytes.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(err)?;
            let mut line = String::new();
            let stdout = child.stdout.take().ok_or("no stdout from the server")?;
            BufReader::new(stdout).read_line(&mut line).map_err(err)?;
            let port = line.trim();
            let received = recv(&format!("127.0.0.1:{port}"));
            let status = child.wait().map_err(err)?;
            let received = received.map_err(err)?;
            if !status.success() {
                return Err(format!("server failed: {status}"));
            }
            if received.bytes != bytes {
                return Err(format!("received {} bytes, expected {bytes}", received.bytes));
            }
            print_received(&received);
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("creditflow-rawtcp: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_and_checks_every_probe() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let bytes = 3 * CHUNK as u64 + 12_345;
        let server = std::thread::spawn(move || serve(&listener, bytes));
        let r = recv(&addr).unwrap();
        server.join().unwrap().unwrap();
        assert_eq!(r.bytes, bytes);
        assert_eq!(r.probes, bytes.div_ceil(PROBE));
    }

    #[test]
    fn pattern_is_periodic_per_chunk() {
        assert_eq!(pattern(0), 0);
        assert_eq!(pattern(251), 0);
        assert_eq!(pattern(CHUNK as u64), pattern(0));
        assert_eq!(chunk().len(), CHUNK);
    }
}
