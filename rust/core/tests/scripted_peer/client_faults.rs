//! Faults on the sending side: a client that goes away fails the writer; garbage, frames a
//! client may not send, a wrong protocol version or silence close that client's connection
//! (with a fatal error where the handshake got that far); limits bound what one client takes.
//! Every other client is still served.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use creditflow_core::base::error::Error;
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::protocol::wire::{
    encode, ErrorKind, Event, Hello, Message, Payload, ReceiverId, PROTOCOL_VERSION,
};

use crate::script::client::{assert_serves, connect, recv_to_end};
use crate::script::{
    add_credit, batch, data, data_msg, env_with, hello, request, wait, write, Got, Peer, IO_TIMEOUT, SEG,
};

#[test]
fn client_going_away_fails_the_writer() {
    let env = env_with(true, |_| {});
    let (mut w, _) = write(&env, "p", 1, Partitioner::Forward, 2, 10);
    let mut p = connect(&env);
    p.send(&[request("p", 0, 1, 1)]);
    data(p.recv());
    drop(p);
    let deadline = Instant::now() + IO_TIMEOUT;
    let err = loop {
        match w.write(&batch(0, 10), &mut wait()) {
            Ok(()) => assert!(Instant::now() < deadline, "the writer never noticed"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(matches!(err, Error::ConnectionLost(_)), "{err}");
}

/// A client sends `bytes` (after the handshake if `handshake`): the environment closes that
/// connection, after the handshake with a fatal Protocol ErrorResponse first, and keeps
/// serving other clients.
fn bad_bytes_close_the_connection(bytes: &[u8], handshake: bool) {
    let env = env_with(true, |_| {});
    let mut p = if handshake {
        connect(&env)
    } else {
        Peer::new(TcpStream::connect(env.address()).unwrap())
    };
    p.send_raw(bytes);
    let got = p.recv_until_closed(IO_TIMEOUT);
    let fatal = |m: &Message<'_>| {
        matches!(
            m,
            Message::ErrorResponse {
                receiver: None,
                kind: ErrorKind::Protocol,
                ..
            }
        )
    };
    assert!(got.iter().all(fatal), "{got:?}");
    if handshake {
        assert_eq!(got.len(), 1, "{got:?}");
    }
    assert_serves(&env);
}

#[test]
fn garbage_before_the_handshake_closes_the_connection() {
    bad_bytes_close_the_connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false);
}

#[test]
fn wrong_magic_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(&add_credit(1, 1), &mut bytes).unwrap();
    bytes[4..8].copy_from_slice(b"XXXX");
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn frame_length_2_pow_31_closes_the_connection() {
    bad_bytes_close_the_connection(&(1u32 << 31).to_le_bytes(), true);
}

#[test]
fn frame_length_2_pow_31_before_the_handshake_closes_the_connection() {
    bad_bytes_close_the_connection(&(1u32 << 31).to_le_bytes(), false);
}

#[test]
fn data_buffer_from_a_client_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(&data_msg(ReceiverId(1), 0, 0, b"not for a server"), &mut bytes).unwrap();
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn zero_new_buffer_size_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(
        &Message::NewBufferSize {
            receiver: ReceiverId(1),
            size: 1,
        },
        &mut bytes,
    )
    .unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&0u32.to_le_bytes());
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn new_buffer_size_over_the_segment_size_closes_the_connection() {
    let mut bytes = Vec::new();
    encode(
        &Message::NewBufferSize {
            receiver: ReceiverId(1),
            size: SEG as u32 + 1,
        },
        &mut bytes,
    )
    .unwrap();
    bad_bytes_close_the_connection(&bytes, true);
}

#[test]
fn wrong_protocol_version_in_hello_is_refused() {
    let env = env_with(true, |_| {});
    // Version 1 peers count credit differently (no record body buffers), version 2 peers
    // start records without record grants, version 3 peers send a shorter Hello (no
    // shared-memory block), version 4 peers do not know SharedBuffer, version 5 peers refuse
    // data buffers longer than a segment: refused too, with the versions named.
    assert_eq!(PROTOCOL_VERSION, 6);
    for version in [1, 2, 3, 4, 5, PROTOCOL_VERSION + 1] {
        let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
        p.send(&[Message::Hello(Hello {
            version,
            ..hello(SEG)
        })]);
        let got = p.recv_until_closed(IO_TIMEOUT);
        assert!(
            matches!(
                got.as_slice(),
                [Message::ErrorResponse {
                    receiver: None,
                    kind: ErrorKind::Protocol,
                    message,
                }] if message.contains(&format!("protocol version {version}, this side {PROTOCOL_VERSION}"))
            ),
            "version {version}: {got:?}"
        );
    }
    assert_serves(&env);
}

#[test]
fn silent_client_is_dropped_after_the_handshake_timeout() {
    let env = env_with(true, |c| c.handshake_timeout = Duration::from_millis(300));
    let t = Instant::now();
    let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
    let got = p.recv_until_closed(Duration::from_secs(30));
    assert!(got.is_empty(), "{got:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "dropped after {:?}",
        t.elapsed()
    );
    assert_serves(&env);
}

// ---------------------------------------------------------------------------------------------
// Limits against abusive clients
// ---------------------------------------------------------------------------------------------

/// The message of a fatal LimitExceeded ErrorResponse, or a panic.
fn limit_refusal(msg: &Message<'_>) -> String {
    match msg {
        Message::ErrorResponse {
            receiver: None,
            kind: ErrorKind::LimitExceeded,
            message,
        } => message.clone(),
        other => panic!("expected a fatal LimitExceeded ErrorResponse, got {other:?}"),
    }
}

#[test]
fn slowloris_client_sending_one_byte_at_a_time_is_dropped() {
    let env = env_with(true, |c| c.handshake_timeout = Duration::from_millis(500));
    let mut hello_bytes = Vec::new();
    encode(&Message::Hello(hello(SEG)), &mut hello_bytes).unwrap();
    let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
    let mut sent = 0;
    let closed = loop {
        if sent == hello_bytes.len() {
            break false;
        }
        if p.stream.write_all(&hello_bytes[sent..sent + 1]).is_err() {
            break true;
        }
        sent += 1;
        match p.next_within(Duration::from_millis(100)) {
            Got::Quiet => {}
            Got::Closed => break true,
            Got::Msg(m) => panic!("a slowloris client got {m:?}"),
        }
    };
    assert!(
        closed,
        "the whole Hello went out one byte per 100 ms ({} bytes) without being dropped",
        hello_bytes.len()
    );
    assert!(sent < hello_bytes.len(), "dropped only after {sent} bytes");
    assert_serves(&env);
}

#[test]
fn connection_over_max_connections_is_refused_and_the_others_are_served() {
    let env = env_with(true, |c| c.limits.max_connections = 2);
    let mut first = connect(&env);
    let mut second = connect(&env);
    // The third gets a refusal naming the limit in answer to its Hello, then the end.
    let mut third = Peer::new(TcpStream::connect(env.address()).unwrap());
    third.send(&[Message::Hello(hello(SEG))]);
    let got = third.recv_until_closed(IO_TIMEOUT);
    assert_eq!(got.len(), 1, "{got:?}");
    let message = limit_refusal(&got[0]);
    assert!(message.contains("max_connections=2"), "{message}");
    // The two connections in use are still served.
    for (p, rid) in [(&mut first, 1), (&mut second, 2)] {
        p.send(&[request("nope", 0, rid, 1)]);
        assert!(matches!(p.recv(), Message::PartitionNotFound { receiver } if receiver == ReceiverId(rid)));
    }
    // Once one of them closes, its slot is free again (released when the server sees the end).
    drop(first);
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let mut p = Peer::new(TcpStream::connect(env.address()).unwrap());
        p.send(&[Message::Hello(hello(SEG))]);
        match p.recv() {
            Message::HelloAck { .. } => break,
            other => {
                limit_refusal(&other);
                assert!(
                    Instant::now() < deadline,
                    "the closed connection's slot never came back"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn channel_over_max_channels_per_connection_is_refused_and_the_others_are_served() {
    let env = env_with(true, |c| c.limits.max_channels_per_connection = 2);
    let (mut w, _) = write(&env, "p", 3, Partitioner::Broadcast, 1, 10);
    w.close().unwrap();
    let mut p = connect(&env);
    p.send(&[
        request("p", 0, 1, 8),
        request("p", 1, 2, 8),
        request("p", 2, 3, 8),
    ]);
    let mut ended = Vec::new();
    let mut refused = None;
    while ended.len() < 2 || refused.is_none() {
        match p.recv() {
            Message::ErrorResponse {
                receiver: Some(ReceiverId(3)),
                kind: ErrorKind::LimitExceeded,
                message,
            } => refused = Some(message),
            Message::BufferResponse(b) if matches!(b.payload, Payload::Event(Event::EndOfPartition)) => {
                ended.push(b.receiver.0)
            }
            Message::BufferResponse(b) => assert!([1, 2].contains(&b.receiver.0), "{b:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    ended.sort();
    assert_eq!(ended, [1, 2]);
    assert!(refused.unwrap().contains("max_channels_per_connection=2"));
    // Ended channels no longer count: the third subpartition can be read now.
    p.send(&[request("p", 2, 4, 8)]);
    assert_eq!(recv_to_end(&mut p, 4, 0).len(), 1);
}

#[test]
fn client_that_never_reads_its_answers_is_closed_at_max_outstanding_requests() {
    let env = env_with(true, |c| c.limits.max_outstanding_requests = 4);
    let p = connect(&env);
    // Requests for a partition that does not exist, each answered PartitionNotFound, sent
    // without reading until the environment closes the connection (the answers fill both
    // socket buffers first, then the environment's queue).
    let mut stream = p.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut chunk = Vec::new();
        for rid in 0..1000u64 {
            encode(&request("nope", 0, rid, 1), &mut chunk).unwrap();
        }
        let mut sent = 0usize;
        while sent < 1 << 30 {
            if stream.write_all(&chunk).is_err() {
                return sent;
            }
            sent += chunk.len();
        }
        panic!("the environment read 1 GiB of requests without closing the connection");
    });
    let sent = writer.join().unwrap();
    assert!(sent > 0);
    // What did arrive is answers, and at most the refusal at the end.
    let mut p = p;
    let got = p.recv_until_closed(Duration::from_secs(60));
    for (i, m) in got.iter().enumerate() {
        match m {
            Message::PartitionNotFound { .. } => {}
            m if i + 1 == got.len() => {
                assert!(limit_refusal(m).contains("max_outstanding_requests=4"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_serves(&env);
}
