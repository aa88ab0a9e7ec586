//! Accepting the `:authority` that gRPC clients send on a unix socket.
//!
//! grpc-go, dialled by a bare socket path as the kubelet's plugin watcher does, sends the
//! percent-encoded path as `:authority` (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F...`). The
//! h2 crate under tonic refuses any `:authority` that is not a valid URI authority (a `%` outside
//! the user info, a `/`) with `PROTOCOL_ERROR`, and upstream keeps that rule. The kubelet's
//! registration would fail, and so would other clients on the CSI socket.
//!
//! [`AuthorityFix`] wraps every accepted unix-socket connection and rewrites, on the way in, an
//! invalid `:authority` value to a valid one of the same length: every byte other than
//! `A-Z a-z 0-9 - . _ ~` becomes `_`. Nothing on a unix socket uses the authority (no virtual
//! hosts, no TLS names), so the value only has to pass h2's check. Everything else passes
//! through byte for byte.
//!
//! How: the client's side of the connection is read as HTTP/2 frames (preface, then 9-byte
//! frame headers). Non-header frames are copied through as they arrive. A `HEADERS` frame and its
//! `CONTINUATION` frames are collected until `END_HEADERS`; the HPACK block (without padding and
//! priority fields) is walked representation by representation ([`hpack`]), keeping a copy of the
//! names in the server's dynamic table, so an `:authority` named by static index 1, by a literal
//! name or by a dynamic-table entry is found in every literal form (incremental indexing, without
//! indexing, never indexed), Huffman-coded ([`huffman`], RFC 7541 Appendix B) or not. A replaced
//! value is re-emitted as a plain literal of the same decoded length, so the server's dynamic
//! table keeps exactly the sizes of the client's: a later request that refers to the authority by
//! table index gets the replaced value. The block is then sent as one `HEADERS` frame (padding
//! dropped, priority kept) followed by `CONTINUATION` frames when it exceeds 16 KiB, the default
//! maximum frame size the server advertises. Blocks without a change are forwarded unmodified.
//!
//! A stream that is not HTTP/2 with prior knowledge, or whose framing or HPACK cannot be decoded,
//! is passed through from that point on unchanged, for h2 to reject as before.

mod hpack;
mod huffman;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `SETTINGS_MAX_FRAME_SIZE`'s initial value; tonic's server keeps it.
const MAX_FRAME: usize = 16_384;
/// Header blocks larger than this are not inspected (the stream is passed through from there).
const MAX_BLOCK: usize = 1 << 20;

/// `value` if it is a valid `:authority` for h2, else the same-length replacement.
fn fix_authority(value: &[u8]) -> Option<Vec<u8>> {
    let valid = |v: &[u8]| http::uri::Authority::try_from(v).is_ok();
    if value.is_empty() || valid(value) {
        return None;
    }
    let fixed: Vec<u8> = value
        .iter()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(b) {
                *b
            } else {
                b'_'
            }
        })
        .collect();
    valid(&fixed).then_some(fixed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the client connection preface.
    Preface,
    /// Expecting a frame header.
    Frames,
    /// Copying this many more payload bytes of a frame that is not inspected.
    Payload(usize),
    /// Copying everything (not HTTP/2 with prior knowledge, or undecodable).
    Bypass,
}

/// A header block being collected: the original frames, and the HPACK fragment they carry.
#[derive(Debug)]
struct Block {
    raw: Vec<u8>,
    fragment: Vec<u8>,
    stream: u32,
    /// The `HEADERS` frame's flags.
    flags: u8,
    /// The `HEADERS` frame's priority fields, if it had them.
    priority: Option<[u8; 5]>,
}

/// The rewriting state machine of one connection's client-to-server bytes, without I/O.
#[derive(Debug)]
pub(crate) struct Rewriter {
    state: State,
    pending: Vec<u8>,
    block: Option<Block>,
    table: hpack::Table,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            state: State::Preface,
            pending: Vec::new(),
            block: None,
            table: hpack::Table::default(),
        }
    }
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    // len <= MAX_FRAME < 2^24.
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

impl Rewriter {
    /// Takes `input` read from the client and appends what the server should read to `out`.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.state == State::Bypass && self.pending.is_empty() {
            out.extend_from_slice(input);
            return;
        }
        self.pending.extend_from_slice(input);
        self.process(out);
    }

    /// The client closed its side: whatever is held back goes out as it came.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        self.bypass(out);
    }

    fn bypass(&mut self, out: &mut Vec<u8>) {
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        out.append(&mut self.pending);
        self.state = State::Bypass;
    }

    fn process(&mut self, out: &mut Vec<u8>) {
        loop {
            match self.state {
                State::Bypass => {
                    self.bypass(out);
                    return;
                }
                State::Preface => {
                    let n = self.pending.len().min(PREFACE.len());
                    if self.pending[..n] != PREFACE[..n] {
                        self.state = State::Bypass;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    out.extend(self.pending.drain(..n));
                    self.state = State::Frames;
                }
                State::Payload(remaining) => {
                    let n = remaining.min(self.pending.len());
                    out.extend(self.pending.drain(..n));
                    self.state = if n == remaining {
                        State::Frames
                    } else {
                        State::Payload(remaining - n)
                    };
                    if self.pending.is_empty() {
                        return;
                    }
                }
                State::Frames => {
                    if self.pending.len() < FRAME_HEADER {
                        return;
                    }
                    let head = &self.pending[..FRAME_HEADER];
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let (kind, flags) = (head[3], head[4]);
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    let in_block = self.block.as_ref().map(|b| b.stream);
                    match (kind, in_block) {
                        (CONTINUATION, Some(block_stream)) if block_stream == stream => {}
                        (_, Some(_)) => {
                            // Only CONTINUATION of the same stream may follow: h2 will reject.
                            self.state = State::Bypass;
                            continue;
                        }
                        (HEADERS, None) => {}
                        _ => {
                            out.extend(self.pending.drain(..FRAME_HEADER));
                            if len > 0 {
                                self.state = State::Payload(len);
                            }
                            continue;
                        }
                    }
                    let collected = self.block.as_ref().map_or(0, |b| b.raw.len());
                    if collected + FRAME_HEADER + len > MAX_BLOCK {
                        self.state = State::Bypass;
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
                    if !self.header_frame(kind, flags, stream, frame, out) {
                        self.state = State::Bypass;
                    }
                }
            }
        }
    }

    /// Adds a `HEADERS` or `CONTINUATION` frame to the block; `false` when it is malformed.
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        frame: Vec<u8>,
        out: &mut Vec<u8>,
    ) -> bool {
        let payload = &frame[FRAME_HEADER..];
        if kind == HEADERS {
            let mut start = 0;
            let mut pad = 0;
            if flags & PADDED != 0 {
                let Some(&len) = payload.first() else {
                    out.extend_from_slice(&frame);
                    return false;
                };
                pad = usize::from(len);
                start = 1;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let Some(fields) = payload.get(start..start + 5) else {
                    out.extend_from_slice(&frame);
                    return false;
                };
                let mut copy = [0u8; 5];
                copy.copy_from_slice(fields);
                priority = Some(copy);
                start += 5;
            }
            let Some(fragment) = payload
                .len()
                .checked_sub(pad)
                .and_then(|end| payload.get(start..end))
            else {
                out.extend_from_slice(&frame);
                return false;
            };
            self.block = Some(Block {
                fragment: fragment.to_vec(),
                raw: frame,
                stream,
                flags,
                priority,
            });
        } else if let Some(block) = self.block.as_mut() {
            block.fragment.extend_from_slice(payload);
            block.raw.extend_from_slice(&frame);
        }
        if flags & END_HEADERS == 0 {
            return true;
        }
        let Some(block) = self.block.take() else {
            return true;
        };
        match hpack::rewrite_authority(&mut self.table, &block.fragment, fix_authority) {
            Ok(None) => {
                out.extend_from_slice(&block.raw);
                true
            }
            Ok(Some(fragment)) => {
                emit_block(&block, &fragment, out);
                true
            }
            Err(error) => {
                tracing::debug!(
                    ?error,
                    "undecodable header block; passing the connection through"
                );
                out.extend_from_slice(&block.raw);
                false
            }
        }
    }
}

/// Sends `fragment` as the header block of `block`'s stream: a `HEADERS` frame (its `END_STREAM`
/// and priority kept, no padding) and as many `CONTINUATION` frames as needed.
fn emit_block(block: &Block, fragment: &[u8], out: &mut Vec<u8>) {
    let priority_len = if block.priority.is_some() { 5 } else { 0 };
    let first_len = fragment.len().min(MAX_FRAME - priority_len);
    let (first, rest) = fragment.split_at(first_len);
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    frame_header(
        priority_len + first.len(),
        HEADERS,
        block.flags & (END_STREAM | PRIORITY) | end,
        block.stream,
        out,
    );
    if let Some(priority) = &block.priority {
        out.extend_from_slice(priority);
    }
    out.extend_from_slice(first);
    let mut chunks = rest.chunks(MAX_FRAME).peekable();
    while let Some(chunk) = chunks.next() {
        let end = if chunks.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        frame_header(chunk.len(), CONTINUATION, end, block.stream, out);
        out.extend_from_slice(chunk);
    }
}

/// A server-side connection whose client-sent `:authority` values are made acceptable to h2;
/// see the [module documentation](self).
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    out: Vec<u8>,
    out_pos: usize,
    scratch: Box<[u8]>,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.rewriter.finish(&mut this.out);
                this.eof = true;
            } else {
                this.rewriter.feed(read.filled(), &mut this.out);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::huffman::tests::encode;
    use super::*;

    const AUTHORITY: &[u8] =
        b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Frbd.provisioner.ceph.io-reg.sock";
    const FIXED: &[u8] =
        b"_2Fvar_2Flib_2Fkubelet_2Fplugins_registry_2Frbd.provisioner.ceph.io-reg.sock";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame_header(payload.len(), kind, flags, stream, &mut out);
        out.extend_from_slice(payload);
        out
    }

    /// :method POST, :scheme http, :path (static name 4), :authority (static name 1, Huffman).
    fn grpc_go_block() -> Vec<u8> {
        let mut block = vec![0x83, 0x86, 0x44, 7];
        block.extend(b"/a.B/Cd");
        let coded = encode(AUTHORITY);
        block.push(0x41);
        block.push(0x80 | u8::try_from(coded.len()).unwrap());
        block.extend(coded);
        block
    }

    fn fixed_block() -> Vec<u8> {
        let mut block = vec![0x83, 0x86, 0x44, 7];
        block.extend(b"/a.B/Cd");
        block.push(0x41);
        block.push(u8::try_from(FIXED.len()).unwrap());
        block.extend(FIXED);
        block
    }

    /// Feeds `input` in pieces of `step` bytes.
    fn run(input: &[u8], step: usize) -> Vec<u8> {
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            rewriter.feed(piece, &mut out);
        }
        rewriter.finish(&mut out);
        out
    }

    #[test]
    fn the_authority_is_replaced_and_other_frames_pass_untouched_in_any_split() {
        let data = frame(0, END_STREAM, 1, b"\0\0\0\0\x02hi");
        let mut input = PREFACE.to_vec();
        input.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]));
        input.extend(frame(HEADERS, END_HEADERS, 1, &grpc_go_block()));
        input.extend(&data);
        // Request 2 names :path and :authority by dynamic index (newest first: :authority 62,
        // :path 63).
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &[0x83, 0x86, 0xbf, 0xbe],
        ));
        let mut expected = PREFACE.to_vec();
        expected.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]));
        expected.extend(frame(HEADERS, END_HEADERS, 1, &fixed_block()));
        expected.extend(&data);
        expected.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &[0x83, 0x86, 0xbf, 0xbe],
        ));
        for step in [1, 2, 7, 9, 24, 100, input.len()] {
            assert_eq!(run(&input, step), expected, "fed {step} bytes at a time");
        }
    }

    #[test]
    fn the_dynamic_table_holds_the_replaced_value_with_the_clients_sizes() {
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &grpc_go_block()));
        rewriter.feed(&input, &mut out);
        // :authority (newest, 62) and :path (63); sizes as the client computed them.
        assert_eq!(
            rewriter.table.size,
            (10 + AUTHORITY.len() + 32) + (5 + 7 + 32)
        );
        // A second block with a literal *without* indexing naming dynamic entry 62's name.
        let mut second = vec![0x83, 0x0f, 0x2f];
        second.push(4);
        second.extend(b"%2Fx");
        let before = out.len();
        rewriter.feed(&frame(HEADERS, END_HEADERS, 3, &second), &mut out);
        let mut expected = vec![0x83, 0x0f, 0x2f, 4];
        expected.extend(b"_2Fx");
        assert_eq!(out[before..], frame(HEADERS, END_HEADERS, 3, &expected));
    }

    #[test]
    fn a_continuation_split_padded_prioritised_block_is_reassembled() {
        let block = grpc_go_block();
        let (a, b) = block.split_at(20);
        let mut headers = vec![3]; // pad length
        headers.extend([0x80, 0, 0, 0, 15]); // exclusive dependency on stream 0, weight 16
        headers.extend(a);
        headers.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &headers));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        let mut payload = vec![0x80, 0, 0, 0, 15];
        payload.extend(fixed_block());
        let mut expected = PREFACE.to_vec();
        expected.extend(frame(
            HEADERS,
            PRIORITY | END_STREAM | END_HEADERS,
            1,
            &payload,
        ));
        for step in [1, 5, input.len()] {
            assert_eq!(run(&input, step), expected, "fed {step} bytes at a time");
        }
    }

    #[test]
    fn a_block_larger_than_a_frame_after_decoding_is_split_into_continuations() {
        // 12 000 Huffman-coded '%' (6 bits each: 9 000 bytes) grow to 12 000 plain bytes, and
        // a 10 000-byte plain header before them pushes the block past 16 KiB.
        let authority = vec![b'%'; 12_000];
        let mut block = vec![0x00, 5]; // literal without indexing, literal name
        block.extend(b"x-pad");
        block.extend([0x7f, 0x91, 0x4d]); // 10 000 = 127 + 9873 (0x91 0x4d)
        block.extend(vec![b'a'; 10_000]);
        block.push(0x01); // :authority without indexing
        let coded = encode(&authority);
        hpack_len(&mut block, 0x80, coded.len());
        block.extend(&coded);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let out = run(&input, 4096);
        // Frames: HEADERS of 16 384 without END_HEADERS, CONTINUATION with it.
        let first_len =
            usize::from(out[24]) << 16 | usize::from(out[25]) << 8 | usize::from(out[26]);
        assert_eq!((first_len, out[27], out[28]), (MAX_FRAME, HEADERS, 0));
        let second = 24 + 9 + MAX_FRAME;
        assert_eq!(
            (out[second + 3], out[second + 4]),
            (CONTINUATION, END_HEADERS)
        );
        let mut fragment = out[24 + 9..second].to_vec();
        fragment.extend(&out[second + 9..]);
        assert!(fragment.ends_with(&vec![b'_'; 12_000]));
        assert_eq!(fragment.len(), 1 + 1 + 5 + 3 + 10_000 + 1 + 3 + 12_000);
    }

    fn hpack_len(out: &mut Vec<u8>, flags: u8, len: usize) {
        out.push(flags | 0x7f);
        let mut rest = len - 0x7f;
        while rest >= 0x80 {
            out.push(u8::try_from(rest & 0x7f).unwrap() | 0x80);
            rest >>= 7;
        }
        out.push(u8::try_from(rest).unwrap());
    }

    #[test]
    fn valid_authorities_and_non_http2_streams_pass_untouched() {
        let mut block = vec![0x83, 0x41, 9];
        block.extend(b"localhost");
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        assert_eq!(run(&input, 3), input);
        let http1 = b"GET / HTTP/1.1\r\nHost: %2F\r\n\r\n".to_vec();
        assert_eq!(run(&http1, 5), http1);
        // A truncated stream comes out as it went in.
        let cut = &input[..input.len() - 4];
        assert_eq!(run(cut, 7), cut);
    }

    #[test]
    fn malformed_framing_or_hpack_is_passed_through_for_h2_to_reject() {
        // Undecodable Huffman in the authority, then a valid-looking block that must also pass
        // through unchanged (the table is no longer known).
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0x41, 0x81, 0x00]));
        let mut later = vec![0x41, 3];
        later.extend(b"%2F");
        input.extend(frame(HEADERS, END_HEADERS, 3, &later));
        assert_eq!(run(&input, 4), input);
        // A DATA frame interleaved in an unfinished header block.
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &grpc_go_block()));
        input.extend(frame(0, 0, 1, b"x"));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[]));
        assert_eq!(run(&input, 11), input);
        // Padding longer than the payload.
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x83]));
        input.extend(frame(HEADERS, END_HEADERS, 3, &later));
        assert_eq!(run(&input, 1), input);
    }

    #[test]
    fn only_invalid_authorities_are_replaced() {
        assert_eq!(fix_authority(b"localhost"), None);
        assert_eq!(fix_authority(b"[::1]:50051"), None);
        assert_eq!(fix_authority(b""), None);
        assert_eq!(
            fix_authority(b"/tmp/csi.sock").as_deref(),
            Some(&b"_tmp_csi.sock"[..])
        );
        assert_eq!(fix_authority(AUTHORITY).as_deref(), Some(FIXED));
    }
}
