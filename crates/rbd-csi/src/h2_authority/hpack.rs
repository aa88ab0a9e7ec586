//! Just enough HPACK (RFC 7541) to find `:authority` in a header block and replace its value.
//!
//! Every representation is walked so that the dynamic table's names can be tracked (a literal
//! may name `:authority` by a dynamic-table index). Values are not kept, only their decoded
//! lengths, which is all the table's eviction needs.

use std::collections::VecDeque;

use super::huffman;

/// Names of the static table (RFC 7541 Appendix A), index 1 to 61.
const STATIC_NAMES: [&[u8]; 61] = [
    b":authority",
    b":method",
    b":method",
    b":path",
    b":path",
    b":scheme",
    b":scheme",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b":status",
    b"accept-charset",
    b"accept-encoding",
    b"accept-language",
    b"accept-ranges",
    b"accept",
    b"access-control-allow-origin",
    b"age",
    b"allow",
    b"authorization",
    b"cache-control",
    b"content-disposition",
    b"content-encoding",
    b"content-language",
    b"content-length",
    b"content-location",
    b"content-range",
    b"content-type",
    b"cookie",
    b"date",
    b"etag",
    b"expect",
    b"expires",
    b"from",
    b"host",
    b"if-match",
    b"if-modified-since",
    b"if-none-match",
    b"if-range",
    b"if-unmodified-since",
    b"last-modified",
    b"link",
    b"location",
    b"max-forwards",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"range",
    b"referer",
    b"refresh",
    b"retry-after",
    b"server",
    b"set-cookie",
    b"strict-transport-security",
    b"transfer-encoding",
    b"user-agent",
    b"vary",
    b"via",
    b"www-authenticate",
];

/// The size of the decoder's dynamic table before the client changes it: the HTTP/2 default of
/// `SETTINGS_HEADER_TABLE_SIZE`, which the server (h2 as tonic configures it) keeps.
pub(crate) const DEFAULT_TABLE_SIZE: usize = 4096;

/// Why a header block cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HpackError {
    Truncated,
    IntegerOverflow,
    BadIndex,
    Huffman,
}

impl From<huffman::InvalidHuffman> for HpackError {
    fn from(_: huffman::InvalidHuffman) -> Self {
        Self::Huffman
    }
}

/// The decoder's dynamic table as far as names and sizes go, newest entry first.
#[derive(Debug)]
pub(crate) struct Table {
    entries: VecDeque<(Vec<u8>, usize)>,
    pub(super) size: usize,
    max_size: usize,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max_size: DEFAULT_TABLE_SIZE,
        }
    }
}

impl Table {
    fn name(&self, index: usize) -> Result<&[u8], HpackError> {
        match index {
            0 => Err(HpackError::BadIndex),
            1..=61 => Ok(STATIC_NAMES[index - 1]),
            _ => self
                .entries
                .get(index - 62)
                .map(|(name, _)| name.as_slice())
                .ok_or(HpackError::BadIndex),
        }
    }

    fn check_index(&self, index: usize) -> Result<(), HpackError> {
        self.name(index).map(|_| ())
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.entries.pop_back() {
                Some((_, size)) => self.size -= size,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: Vec<u8>, value_len: usize) {
        let size = name.len() + value_len + 32;
        if size > self.max_size {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.entries.push_front((name, size));
        self.size += size;
    }

    fn resize(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }
}

/// Decodes an HPACK integer with an `prefix`-bit prefix at `block[pos]`: (value, next position).
fn integer(block: &[u8], pos: usize, prefix: u32) -> Result<(usize, usize), HpackError> {
    let mask = (1usize << prefix) - 1;
    let first = *block.get(pos).ok_or(HpackError::Truncated)?;
    let mut value = usize::from(first) & mask;
    let mut pos = pos + 1;
    if value < mask {
        return Ok((value, pos));
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(pos).ok_or(HpackError::Truncated)?;
        pos += 1;
        if shift > 28 {
            return Err(HpackError::IntegerOverflow);
        }
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok((value, pos));
        }
    }
}

/// Appends an HPACK integer with a `prefix`-bit prefix, the first byte's high bits `flags`.
fn push_integer(out: &mut Vec<u8>, flags: u8, prefix: u32, value: usize) {
    let low7 = |v: usize| u8::try_from(v & 0x7f).unwrap_or(0);
    let mask = (1usize << prefix) - 1;
    if value < mask {
        // Fits in the prefix (at most 7 bits).
        out.push(flags | low7(value));
        return;
    }
    out.push(flags | low7(mask));
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(low7(rest) | 0x80);
        rest >>= 7;
    }
    out.push(low7(rest));
}

/// Decodes a string literal at `block[pos]`: (decoded bytes, next position).
fn string(block: &[u8], pos: usize) -> Result<(Vec<u8>, usize), HpackError> {
    let huffman_coded = block.get(pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, start) = integer(block, pos, 7)?;
    let end = start.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = block.get(start..end).ok_or(HpackError::Truncated)?;
    let decoded = if huffman_coded {
        huffman::decode(raw)?
    } else {
        raw.to_vec()
    };
    Ok((decoded, end))
}

/// Walks the header block `block`, keeping `table` in step with the peer's encoder, and returns
/// the block with every `:authority` value that `fix` replaces re-encoded as a plain literal
/// (same representation and name), or `None` when nothing was replaced. `fix` must return a
/// value of the same length, so the dynamic table's sizes stay those of the peer's encoder.
pub(crate) fn rewrite_authority(
    table: &mut Table,
    block: &[u8],
    fix: impl Fn(&[u8]) -> Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, HpackError> {
    let mut out = Vec::new();
    let mut copied = 0usize;
    let mut pos = 0usize;
    while pos < block.len() {
        let first = block[pos];
        if first & 0x80 != 0 {
            // Indexed header field.
            let (index, next) = integer(block, pos, 7)?;
            table.check_index(index)?;
            pos = next;
            continue;
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (size, next) = integer(block, pos, 5)?;
            table.resize(size);
            pos = next;
            continue;
        }
        // Literal: with incremental indexing (01), without indexing (0000), never indexed (0001).
        let indexing = first & 0xc0 == 0x40;
        let prefix = if indexing { 6 } else { 4 };
        let (name_index, next) = integer(block, pos, prefix)?;
        let (name, value_at) = if name_index == 0 {
            string(block, next)?
        } else {
            (table.name(name_index)?.to_vec(), next)
        };
        let (value, end) = string(block, value_at)?;
        if name == b":authority"
            && let Some(fixed) = fix(&value).filter(|f| f.len() == value.len())
        {
            out.extend_from_slice(&block[copied..value_at]);
            push_integer(&mut out, 0, 7, fixed.len());
            out.extend_from_slice(&fixed);
            copied = end;
        }
        if indexing {
            table.insert(name, value.len());
        }
        pos = end;
    }
    if copied == 0 {
        return Ok(None);
    }
    out.extend_from_slice(&block[copied..]);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::huffman::tests::encode;
    use super::*;

    fn underscore(value: &[u8]) -> Option<Vec<u8>> {
        value.contains(&b'%').then(|| {
            value
                .iter()
                .map(|b| if *b == b'%' { b'_' } else { *b })
                .collect()
        })
    }

    #[test]
    fn integers_round_trip_across_the_prefix_boundary() {
        for prefix in [4, 5, 6, 7] {
            for value in [
                0,
                1,
                14,
                15,
                16,
                30,
                31,
                62,
                63,
                126,
                127,
                128,
                1337,
                1 << 20,
            ] {
                let mut out = Vec::new();
                push_integer(&mut out, 0, prefix, value);
                assert_eq!(
                    integer(&out, 0, prefix),
                    Ok((value, out.len())),
                    "{prefix} {value}"
                );
            }
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 0, 5), Ok((1337, 3)));
        assert_eq!(integer(&[0x1f, 0x9a], 0, 5), Err(HpackError::Truncated));
        assert_eq!(
            integer(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 0, 7),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn each_literal_form_and_name_form_is_rewritten() {
        // (first byte(s) of the representation, whether it names :authority by static index)
        for (representation, literal_name) in [
            (vec![0x41], false), // incremental indexing, static name 1
            (vec![0x01], false), // without indexing, static name 1
            (vec![0x11], false), // never indexed, static name 1
            (vec![0x40], true),  // incremental indexing, literal name
            (vec![0x00], true),  // without indexing, literal name
            (vec![0x10], true),  // never indexed, literal name
        ] {
            for huffman_name in [false, true] {
                for huffman_value in [false, true] {
                    let mut block = vec![0x83];
                    block.extend(&representation);
                    if literal_name {
                        push_literal(&mut block, b":authority", huffman_name);
                    }
                    let head = block.len();
                    push_literal(&mut block, b"%2Fa%2Fb.sock", huffman_value);
                    block.push(0x86);
                    let mut table = Table::default();
                    let out = rewrite_authority(&mut table, &block, underscore)
                        .unwrap()
                        .unwrap();
                    let mut expected = block[..head].to_vec();
                    expected.push(13);
                    expected.extend(b"_2Fa_2Fb.sock");
                    expected.push(0x86);
                    assert_eq!(out, expected, "{representation:?} {literal_name}");
                    let indexed = representation[0] & 0xc0 == 0x40;
                    assert_eq!(table.entries.len(), usize::from(indexed));
                }
            }
        }
    }

    fn push_literal(out: &mut Vec<u8>, text: &[u8], huffman_coded: bool) {
        if huffman_coded {
            let coded = encode(text);
            push_integer(out, 0x80, 7, coded.len());
            out.extend(coded);
        } else {
            push_integer(out, 0, 7, text.len());
            out.extend(text);
        }
    }

    #[test]
    fn a_valid_authority_and_other_headers_are_left_alone() {
        let mut block = vec![0x41];
        push_literal(&mut block, b"localhost", true);
        block.push(0x44);
        push_literal(&mut block, b"/a%2Fb", false);
        let mut table = Table::default();
        assert_eq!(rewrite_authority(&mut table, &block, underscore), Ok(None));
        assert_eq!(table.entries.len(), 2);
    }

    #[test]
    fn an_authority_named_by_dynamic_index_is_found() {
        let mut table = Table::default();
        // First block: a literal `:authority` name with a valid value enters the table (62).
        let mut first = vec![0x40];
        push_literal(&mut first, b":authority", true);
        push_literal(&mut first, b"localhost", false);
        assert_eq!(rewrite_authority(&mut table, &first, underscore), Ok(None));
        // Second block: a literal whose name is dynamic entry 62, value to fix.
        let mut second = vec![0x7e];
        push_literal(&mut second, b"%2Fx", true);
        let out = rewrite_authority(&mut table, &second, underscore)
            .unwrap()
            .unwrap();
        assert_eq!(out, [0x7e, 4, b'_', b'2', b'F', b'x']);
    }

    #[test]
    fn eviction_and_size_updates_track_the_encoder() {
        let mut table = Table::default();
        // Table size 100: an entry of 10 + 13 + 32 = 55 fits; the next (7 + 12 + 32) evicts it.
        let mut block = vec![0x3f, 0x45]; // size update to 100 (31 + 69)
        block.push(0x40);
        push_literal(&mut block, b":authority", false);
        push_literal(&mut block, b"%2Fa%2Fb.sock", false);
        block.push(0x40);
        push_literal(&mut block, b"x-other", false);
        push_literal(&mut block, b"value-longer", false);
        let out = rewrite_authority(&mut table, &block, underscore)
            .unwrap()
            .unwrap();
        assert_eq!(table.max_size, 100);
        assert_eq!(table.entries.len(), 1, "the authority was evicted");
        assert_eq!(table.name(62), Ok(&b"x-other"[..]));
        assert!(out.windows(13).any(|w| w == b"_2Fa_2Fb.sock"));
        // A reference to the evicted entry is an error, as in the server's decoder.
        assert_eq!(
            rewrite_authority(&mut table, &[0xbf], underscore),
            Err(HpackError::BadIndex)
        );
        assert_eq!(
            rewrite_authority(&mut table, &[0x80], underscore),
            Err(HpackError::BadIndex)
        );
    }

    #[test]
    fn malformed_blocks_are_errors() {
        assert_eq!(
            rewrite_authority(&mut Table::default(), &[0x41, 0x85, 0xff], underscore),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            rewrite_authority(&mut Table::default(), &[0x41, 0x81, 0x00], underscore),
            Err(HpackError::Huffman)
        );
        assert_eq!(
            rewrite_authority(&mut Table::default(), &[0x7f], underscore),
            Err(HpackError::Truncated)
        );
    }
}
