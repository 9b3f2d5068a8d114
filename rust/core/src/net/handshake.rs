//! The handshake that opens every connection: Hello, HelloAck, AuthProof (see the
//! [wire docs](crate::protocol::wire) for the messages). It settles the payload limit and, with
//! a shared secret, proves both sides know it (HMAC challenge-response, [`super::auth`]).

use tokio::io::AsyncWrite;

use super::auth::{self, Role};
use super::io::{write_message, FrameReader, FrameSource, InFrame};
use crate::base::error::{Error, Result};
use crate::protocol::wire::{self, AuthMode, ErrorKind, Hello, Message, Nonce, ShmOffer, PROTOCOL_VERSION};

/// What the handshake settled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    /// Largest data payload either side sends: the smaller segment size.
    pub payload_limit: usize,
    /// Shared memory, when both sides offered it from one host and one user: the peer's
    /// offer and the link's token (the client's Hello nonce).
    pub shm: Option<(ShmOffer, Nonce)>,
}

fn hello(segment_size: usize, secret: Option<&[u8]>, shm: Option<ShmOffer>) -> Result<Hello> {
    Ok(Hello {
        version: PROTOCOL_VERSION,
        segment_size: segment_size as u32,
        max_frame_size: wire::max_frame_size(segment_size) as u32,
        auth: if secret.is_some() {
            AuthMode::HmacSha256
        } else {
            AuthMode::None
        },
        nonce: auth::nonce()?,
        shm,
    })
}

fn negotiate(ours: &Hello, theirs: &Hello) -> Result<Negotiated> {
    if theirs.version != PROTOCOL_VERSION {
        return Err(Error::Protocol(format!(
            "the peer speaks protocol version {}, this side {}",
            theirs.version, PROTOCOL_VERSION
        )));
    }
    let payload_limit = ours.segment_size.min(theirs.segment_size) as usize;
    if payload_limit == 0 {
        return Err(Error::Protocol("the peer announced segment size 0".into()));
    }
    let shm = match (&ours.shm, &theirs.shm) {
        (Some(a), Some(b)) if a.boot_id == b.boot_id && a.uid == b.uid => Some(*b),
        _ => None,
    };
    Ok(Negotiated {
        payload_limit,
        shm: shm.map(|offer| (offer, [0; wire::NONCE_LEN])),
    })
}

/// A fatal ErrorResponse received where a handshake message was expected, as an error.
pub(crate) fn remote_error(kind: ErrorKind, message: &str) -> Error {
    match kind {
        ErrorKind::Authentication => Error::Authentication(format!("the peer refused us: {message}")),
        ErrorKind::Protocol => Error::Protocol(format!("the peer reports: {message}")),
        ErrorKind::ProducerFailed => Error::ProducerFailed(message.to_string()),
        ErrorKind::LimitExceeded => Error::LimitExceeded(format!("the peer refused us: {message}")),
        _ => Error::ConnectionLost(format!("the peer reports: {message}")),
    }
}

fn unexpected(what: &str, msg: &Message<'_>) -> Error {
    if let Message::ErrorResponse { kind, message, .. } = msg {
        return remote_error(*kind, message);
    }
    Error::Protocol(format!(
        "expected {what} during the handshake, got {:?}",
        msg.message_type()
    ))
}

async fn next_message<R: FrameSource>(r: &mut FrameReader<R>, what: &str) -> Result<Message<'static>> {
    match r.next().await? {
        InFrame::Message(m) => Ok(m),
        InFrame::Data(_) => Err(Error::Protocol(format!(
            "expected {what} during the handshake, got a data buffer"
        ))),
    }
}

/// Client side: Hello → HelloAck (check the server's proof) → AuthProof.
pub(crate) async fn client_handshake<R, W>(
    r: &mut FrameReader<R>,
    w: &mut W,
    segment_size: usize,
    secret: Option<&[u8]>,
    shm: Option<ShmOffer>,
) -> Result<Negotiated>
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let ours = hello(segment_size, secret, shm)?;
    write_message(w, &Message::Hello(ours)).await?;
    let (theirs, tag) = match next_message(r, "HelloAck").await? {
        Message::HelloAck { hello, tag } => (hello, tag),
        other => return Err(unexpected("HelloAck", &other)),
    };
    let mut negotiated = negotiate(&ours, &theirs)?;
    if let Some((_, token)) = &mut negotiated.shm {
        *token = ours.nonce;
    }
    let proof = match (secret, theirs.auth) {
        (Some(secret), AuthMode::HmacSha256) => {
            if !auth::verify(secret, Role::Server, &ours.nonce, &tag) {
                return Err(Error::Authentication(
                    "the peer does not know the shared secret (wrong HMAC in its HelloAck)".into(),
                ));
            }
            auth::tag(secret, Role::Client, &theirs.nonce)
        }
        (Some(_), AuthMode::None) => {
            return Err(Error::Authentication(
                "this environment has a secret but the peer has none; give both the same secret".into(),
            ))
        }
        (None, AuthMode::HmacSha256) => {
            return Err(Error::Authentication(
                "the peer requires a shared secret; pass secret=... to this environment".into(),
            ))
        }
        (None, AuthMode::None) => Default::default(),
    };
    write_message(w, &Message::AuthProof { tag: proof }).await?;
    r.set_max_frame_size(wire::max_frame_size(negotiated.payload_limit));
    Ok(negotiated)
}

/// Server side: Hello → HelloAck → AuthProof (checked). On an authentication failure the
/// peer gets a fatal ErrorResponse before the error is returned.
pub(crate) async fn server_handshake<R, W>(
    r: &mut FrameReader<R>,
    w: &mut W,
    segment_size: usize,
    secret: Option<&[u8]>,
    shm: Option<ShmOffer>,
) -> Result<Negotiated>
where
    R: FrameSource,
    W: AsyncWrite + Unpin,
{
    let theirs = match next_message(r, "Hello").await? {
        Message::Hello(h) => h,
        other => return Err(unexpected("Hello", &other)),
    };
    let refuse = |message: &str| Message::error_response(None, ErrorKind::Authentication, message);
    let ours = hello(segment_size, secret, shm)?;
    let tag = match (secret, theirs.auth) {
        (Some(secret), AuthMode::HmacSha256) => auth::tag(secret, Role::Server, &theirs.nonce),
        (Some(_), AuthMode::None) => {
            let msg = "this environment requires a shared secret and the peer offered none";
            let _ = write_message(w, &refuse(msg)).await;
            return Err(Error::Authentication(msg.into()));
        }
        (None, AuthMode::HmacSha256) => {
            let msg = "the peer has a shared secret but this environment has none";
            let _ = write_message(w, &refuse(msg)).await;
            return Err(Error::Authentication(msg.into()));
        }
        (None, AuthMode::None) => Default::default(),
    };
    let mut negotiated = match negotiate(&ours, &theirs) {
        Ok(n) => n,
        Err(e) => {
            let _ = write_message(
                w,
                &Message::error_response(None, ErrorKind::Protocol, &e.to_string()),
            )
            .await;
            return Err(e);
        }
    };
    if let Some((_, token)) = &mut negotiated.shm {
        *token = theirs.nonce;
    }
    write_message(w, &Message::HelloAck { hello: ours, tag }).await?;
    let proof = match next_message(r, "AuthProof").await? {
        Message::AuthProof { tag } => tag,
        other => return Err(unexpected("AuthProof", &other)),
    };
    if let Some(secret) = secret {
        if !auth::verify(secret, Role::Client, &ours.nonce, &proof) {
            let msg = "wrong shared secret (bad HMAC in AuthProof)";
            let _ = write_message(w, &refuse(msg)).await;
            return Err(Error::Authentication(msg.into()));
        }
    }
    r.set_max_frame_size(wire::max_frame_size(negotiated.payload_limit));
    Ok(negotiated)
}
