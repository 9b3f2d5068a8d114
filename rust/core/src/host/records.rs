//! Batches over a link: each stream (a writer's one, a gate's one per channel, since channels
//! may differ in schema) is Arrow IPC records as a subpartition's stream is (the schema in the
//! first record, dictionaries when they change). A record of 64 KiB or more is placed in the
//! link's heap when a run of chunks is free, and its frame only names it; the receiver decodes
//! it where it lies and frees the chunks when the last batch over them is dropped. Any other
//! record goes through the ring, inside its frame, into a block of the receiver's record pool.
//!
//! A writer splits its batches itself and sends each piece as a record of its own that holds
//! its schema (a piece frame), so that the service can hand a piece that lies in the writer
//! link's heap to the task that reads its subpartition as it lies (a forward frame, naming the
//! writer link's heap, which that task maps): the piece's bytes are written once, by the
//! writer, and read where they lie by the reader.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::codec::{self, Forwarded, In, RecordHead, Signal, FRAME_HEADER};
use super::link::{lost, read_body, read_header};
use crate::base::error::{Error, Result};
use crate::memory::RecordPool;
use crate::net::shm::{HeapLease, HeapReader, HeapWriter, MIN_ITEM};
use crate::serde::{
    BatchEncoder, Compression, EncodedRecord, RecordDeserializer, RowsEncoder, RowsLayout, RECORD_HEADER_LEN,
};

/// What one record frame (and its bytes) take to send: written in order.
pub(crate) type Frame = Vec<Buffer>;

/// A frame of small parts only.
pub(crate) fn small(bytes: Vec<u8>) -> Frame {
    vec![Buffer::from_vec(bytes)]
}

/// Encodes the batches of a link's streams and places the large ones in its heap.
pub(crate) struct RecordSender {
    encoders: HashMap<u32, BatchEncoder>,
    compression: Option<Compression>,
}

impl RecordSender {
    pub(crate) fn new(compression: Option<Compression>) -> RecordSender {
        RecordSender {
            encoders: HashMap::new(),
            compression,
        }
    }

    /// The frame that carries `batch` on stream `head.channel`: in `heap` when it is large
    /// enough and a run of chunks is free, else inline.
    pub(crate) fn frame(
        &mut self,
        head: RecordHead,
        batch: &RecordBatch,
        heap: &HeapWriter,
    ) -> Result<Frame> {
        let encoder = match self.encoders.get_mut(&head.channel) {
            Some(e) => e,
            None => self
                .encoders
                .entry(head.channel)
                .or_insert(BatchEncoder::with_compression(
                    batch.schema_ref(),
                    self.compression,
                )?),
        };
        let record = encoder.encode(batch)?;
        let (frame, _) = place(record, heap, |s, l| head.item(s, l), |n| head.inline(n));
        Ok(frame)
    }

    /// The frame that carries a piece (`head.channel`: its subpartition) as a record that
    /// holds its schema: in `heap` when it is large enough and a run of chunks is free (the
    /// item's start and length come back too, to take it back if the frame is not sent), else
    /// inline.
    pub(crate) fn piece(
        &self,
        head: RecordHead,
        batch: &RecordBatch,
        heap: &HeapWriter,
    ) -> Result<(Frame, Option<(u64, usize)>)> {
        let record = BatchEncoder::with_compression(batch.schema_ref(), self.compression)?.encode(batch)?;
        Ok(place(
            record,
            heap,
            |s, l| head.piece_item(s, l),
            |n| head.piece(n),
        ))
    }
}

/// The frame that carries rows `rows` of `batch` (`head.channel`: their subpartition) as a
/// record that holds its schema, which `encoder` writes straight into `heap` when it is large
/// enough and a run of chunks is free (its start and length come back), else into the frame.
pub(crate) fn rows_piece(
    head: RecordHead,
    encoder: &RowsEncoder,
    layout: &RowsLayout,
    batch: &RecordBatch,
    rows: &[u32],
    heap: &HeapWriter,
) -> (Frame, Option<(u64, usize)>) {
    let body = layout.len();
    let len = RECORD_HEADER_LEN + body;
    if len >= MIN_ITEM {
        let placed = heap.place_with(0, false, len, |dst| {
            let (prefix, record) = dst.split_at_mut(RECORD_HEADER_LEN);
            prefix.copy_from_slice(&(body as u64).to_le_bytes());
            encoder.write(layout, batch, rows, record);
        });
        if let Some(start) = placed {
            return (small(head.piece_item(start, len as u64)), Some((start, len)));
        }
    }
    let mut record = vec![0u8; body];
    encoder.write(layout, batch, rows, &mut record);
    let mut frame = small(head.piece(body));
    frame.push(Buffer::from_vec(record));
    (frame, None)
}

/// The frame that carries `record`, a piece as its writer encoded it (`head.channel`: its
/// stream), on another link: in `heap` when it is large enough and a run of chunks is free,
/// else inline. Its bytes are copied as they are, without decoding them.
pub(crate) fn encoded_piece(head: RecordHead, record: &Buffer, heap: &HeapWriter) -> Frame {
    let len = RECORD_HEADER_LEN + record.len();
    if len >= MIN_ITEM {
        let prefix = (record.len() as u64).to_le_bytes();
        let parts = [&prefix[..], record.as_slice()];
        if let Some(start) = heap.place(0, false, len, parts.into_iter()) {
            return small(head.piece_item(start, len as u64));
        }
    }
    let mut frame = small(head.piece(record.len()));
    frame.push(record.clone());
    frame
}

/// `record`'s frame: in `heap` when it is large enough and a run of chunks is free (`item`
/// makes the frame naming its start and length, which come back too), else inline (`inline`
/// makes the header for its body's length).
fn place(
    record: EncodedRecord,
    heap: &HeapWriter,
    item: impl FnOnce(u64, u64) -> Vec<u8>,
    inline: impl FnOnce(usize) -> Vec<u8>,
) -> (Frame, Option<(u64, usize)>) {
    let len = record.len();
    if len >= MIN_ITEM {
        if let Some(start) = heap.place(0, false, len, record.chunks()) {
            return (small(item(start, len as u64)), Some((start, len)));
        }
    }
    let (_prefix, parts) = record.into_parts();
    let body: usize = parts.iter().map(|p| p.len()).sum();
    let mut frame = small(inline(body));
    frame.extend(parts);
    (frame, None)
}

/// What a link brings: a record (its body: the IPC messages, as an Arrow buffer), a piece, a
/// piece left in another link's heap, or another frame.
pub(crate) enum Incoming {
    Record {
        head: RecordHead,
        body: Buffer,
    },
    /// A record that holds its schema; `lease`: the link's heap item it lies in, if any.
    Piece {
        head: RecordHead,
        body: Buffer,
        lease: Option<Arc<HeapLease>>,
    },
    /// A piece that lies in a writer link's heap.
    Forward {
        head: RecordHead,
        piece: Forwarded,
    },
    Signal(Signal),
}

/// Reads the next frame of a link; `None` at a clean end. `max` bounds a record's bytes.
pub(crate) async fn read_incoming<R: AsyncRead + Unpin>(
    r: &mut R,
    heap: Option<&HeapReader>,
    pool: &RecordPool,
    max: usize,
) -> Result<Option<Incoming>> {
    let Some((len, ty)) = read_header(r, max.saturating_add(1 << 20)).await? else {
        return Ok(None);
    };
    let body_len = len - FRAME_HEADER;
    match ty {
        codec::ty::RECORD | codec::ty::PIECE => {
            let (head, body) = read_inline(r, body_len, pool, max).await?;
            Ok(Some(match ty {
                codec::ty::RECORD => Incoming::Record { head, body },
                _ => Incoming::Piece {
                    head,
                    body,
                    lease: None,
                },
            }))
        }
        codec::ty::RECORD_ITEM | codec::ty::PIECE_ITEM => {
            let body = read_body(r, body_len).await?;
            let (head, start, item_len) = RecordHead::decode_item(&body)?;
            let heap = heap.ok_or_else(|| Error::Protocol("a heap record on a link without one".into()))?;
            let (lease, body) = heap_record(heap, start, item_len, max)?;
            Ok(Some(match ty {
                codec::ty::RECORD_ITEM => Incoming::Record { head, body },
                _ => Incoming::Piece {
                    head,
                    body,
                    lease: Some(lease),
                },
            }))
        }
        codec::ty::FORWARD => {
            let body = read_body(r, body_len).await?;
            let (head, piece) = RecordHead::decode_forward(&body)?;
            Ok(Some(Incoming::Forward { head, piece }))
        }
        other => {
            let body = read_body(r, body_len).await?;
            Signal::decode(other, &body).map(|s| Some(Incoming::Signal(s)))
        }
    }
}

/// Reads the rest of an inline record frame of `body_len` bytes: its head, then its record
/// into a block of `pool`.
async fn read_inline<R: AsyncRead + Unpin>(
    r: &mut R,
    body_len: usize,
    pool: &RecordPool,
    max: usize,
) -> Result<(RecordHead, Buffer)> {
    // The head: channel and in-flight ids, then the record's bytes.
    let mut fixed = [0u8; 8];
    if body_len < fixed.len() {
        return Err(Error::Protocol("a record frame too short for its head".into()));
    }
    r.read_exact(&mut fixed).await.map_err(lost)?;
    let ids = u32::from_le_bytes(fixed[4..].try_into().expect("4 bytes")) as usize;
    let head_len = 8 + 8 * ids;
    if body_len < head_len {
        return Err(Error::Protocol("a record frame too short for its head".into()));
    }
    let mut head_bytes = fixed.to_vec();
    head_bytes.extend(read_body(r, head_len - 8).await?);
    let head = RecordHead::decode_inline(&mut In::new(&head_bytes))?;
    let record_len = body_len - head_len;
    if record_len == 0 || record_len > max {
        return Err(Error::Protocol(format!(
            "a record of {record_len} bytes (at most {max})"
        )));
    }
    let mut buf = pool.take(record_len);
    while buf.missing() > 0 {
        let n = std::future::poll_fn(|cx| {
            let mut rb = tokio::io::ReadBuf::uninit(buf.spare());
            match Pin::new(&mut *r).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
        .map_err(lost)?;
        if n == 0 {
            return Err(Error::ConnectionLost("the link ended inside a record".into()));
        }
        // SAFETY: `poll_read` initialized the first `n` bytes of the spare part.
        unsafe { buf.commit(n) };
    }
    Ok((head, buf.freeze()))
}

/// The record a frame places in `heap` at `start`, `len` bytes (length prefix included): the
/// lease on its chunks and its body. An error when the item cannot be one the producer placed.
pub(crate) fn heap_record(
    heap: &HeapReader,
    start: u64,
    len: u64,
    max: usize,
) -> Result<(Arc<HeapLease>, Buffer)> {
    leased_record(heap.lease(start, len).map_err(Error::Protocol)?, max)
}

/// The record `lease`'s item holds (see [`heap_record`]).
pub(crate) fn leased_record(lease: HeapLease, max: usize) -> Result<(Arc<HeapLease>, Buffer)> {
    let len = lease.len();
    let lease = Arc::new(lease);
    let prefix = lease
        .bytes(0, RECORD_HEADER_LEN)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let record_len = len.saturating_sub(RECORD_HEADER_LEN as u64);
    if prefix != Some(record_len) || record_len == 0 || record_len > max as u64 {
        return Err(Error::Protocol(format!(
            "a heap record of {len} bytes whose prefix says {prefix:?}"
        )));
    }
    let body = lease
        .buffer(RECORD_HEADER_LEN, record_len as usize)
        .ok_or_else(|| Error::Protocol("a heap record outside its item".into()))?;
    Ok((lease, body))
}

/// Decodes the records of a link's streams (one decoder per stream).
pub(crate) struct RecordReceiver {
    decoders: HashMap<u32, RecordDeserializer>,
    max: usize,
    out: VecDeque<RecordBatch>,
}

impl RecordReceiver {
    pub(crate) fn new(max: usize) -> RecordReceiver {
        RecordReceiver {
            decoders: HashMap::new(),
            max,
            out: VecDeque::new(),
        }
    }

    /// The batch of one record of stream `channel`.
    pub(crate) fn decode(&mut self, channel: u32, body: Buffer) -> Result<RecordBatch> {
        let max = self.max;
        let d = self
            .decoders
            .entry(channel)
            .or_insert_with(|| RecordDeserializer::new(max));
        d.push_record(body, &mut self.out)?;
        let batch = self
            .out
            .pop_front()
            .ok_or_else(|| Error::Protocol("a record held no batch".into()))?;
        self.out.clear();
        Ok(batch)
    }
}
