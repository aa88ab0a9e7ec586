//! The HPACK Huffman code (RFC 7541 Appendix B), decoding only.
//!
//! The code is canonical: within one code length, codes are consecutive in symbol order, and
//! each length's first code follows the previous length's last. So the table below lists, for
//! each code length, the symbols of that length, and [`codes`] derives every code from it.

use std::sync::OnceLock;

/// The end-of-string symbol; never valid inside a string.
const EOS: u16 = 256;

/// RFC 7541 Appendix B by code length: (bits, symbols with codes of that length).
const BY_LENGTH: &[(u8, &[u16])] = &[
    (5, &[48, 49, 50, 97, 99, 101, 105, 111, 115, 116]),
    (
        6,
        &[
            32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104,
            108, 109, 110, 112, 114, 117,
        ],
    ),
    (
        7,
        &[
            58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
            87, 89, 106, 107, 113, 118, 119, 120, 121, 122,
        ],
    ),
    (8, &[38, 42, 44, 59, 88, 90]),
    (10, &[33, 34, 40, 41, 63]),
    (11, &[39, 43, 124]),
    (12, &[35, 62]),
    (13, &[0, 36, 64, 91, 93, 126]),
    (14, &[94, 125]),
    (15, &[60, 96, 123]),
    (19, &[92, 195, 208]),
    (20, &[128, 130, 131, 162, 184, 194, 224, 226]),
    (
        21,
        &[
            153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230,
        ],
    ),
    (
        22,
        &[
            129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185,
            186, 187, 189, 190, 196, 198, 228, 232, 233,
        ],
    ),
    (
        23,
        &[
            1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166,
            168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239,
        ],
    ),
    (
        24,
        &[9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237],
    ),
    (25, &[199, 207, 234, 235]),
    (
        26,
        &[
            192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255,
        ],
    ),
    (
        27,
        &[
            203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
            253, 254,
        ],
    ),
    (
        28,
        &[
            2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 127, 220, 249,
        ],
    ),
    (30, &[10, 13, 22, 256]),
];

/// Every symbol's (code, bits), indexed by symbol (0..=256).
fn codes() -> [(u32, u8); 257] {
    let mut table = [(0u32, 0u8); 257];
    let mut code = 0u32;
    let mut previous_bits = BY_LENGTH[0].0;
    let mut first = true;
    for &(bits, symbols) in BY_LENGTH {
        for &symbol in symbols {
            if first {
                first = false;
            } else {
                code = (code + 1) << (bits - previous_bits);
            }
            previous_bits = bits;
            table[usize::from(symbol)] = (code, bits);
        }
    }
    table
}

/// One node of the decoding tree: its two children.
#[derive(Clone, Copy)]
enum Child {
    Missing,
    Node(u16),
    Symbol(u16),
}

/// The decoding tree, built once: node 0 is the root.
fn tree() -> &'static [[Child; 2]] {
    static TREE: OnceLock<Vec<[Child; 2]>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut nodes = vec![[Child::Missing; 2]];
        for (symbol, (code, bits)) in (0u16..).zip(codes()) {
            let mut node = 0usize;
            for i in (0..bits).rev() {
                let bit = usize::from((code >> i) & 1 == 1);
                if i == 0 {
                    nodes[node][bit] = Child::Symbol(symbol);
                } else {
                    node = if let Child::Node(next) = nodes[node][bit] {
                        usize::from(next)
                    } else {
                        nodes.push([Child::Missing; 2]);
                        let next = nodes.len() - 1;
                        // 257 symbols need 256 inner nodes: always fits in u16.
                        nodes[node][bit] = Child::Node(u16::try_from(next).unwrap_or(0));
                        next
                    };
                }
            }
        }
        nodes
    })
}

/// Why a Huffman-coded string is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InvalidHuffman;

/// Decodes a Huffman-coded HPACK string. Invalid: a code not in the table, the EOS symbol, or
/// padding longer than 7 bits or not all ones (RFC 7541 section 5.2).
pub(crate) fn decode(input: &[u8]) -> Result<Vec<u8>, InvalidHuffman> {
    let tree = tree();
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let mut node = 0usize;
    // Bits read since the last symbol, and whether all of them were ones.
    let mut pending_bits = 0u32;
    let mut all_ones = true;
    for byte in input {
        for i in (0..8).rev() {
            let bit = (byte >> i) & 1;
            pending_bits += 1;
            all_ones &= bit == 1;
            match tree[node][usize::from(bit)] {
                Child::Node(next) => node = usize::from(next),
                Child::Symbol(EOS) | Child::Missing => return Err(InvalidHuffman),
                Child::Symbol(symbol) => {
                    out.push(u8::try_from(symbol).map_err(|_| InvalidHuffman)?);
                    node = 0;
                    pending_bits = 0;
                    all_ones = true;
                }
            }
        }
    }
    if pending_bits > 7 || !all_ones {
        return Err(InvalidHuffman);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Huffman-codes `input` (test helper: the rewriter itself never encodes).
    pub(crate) fn encode(input: &[u8]) -> Vec<u8> {
        let codes = codes();
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u64, 0u32);
        for &byte in input {
            let (code, len) = codes[usize::from(byte)];
            acc = (acc << len) | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                bits -= 8;
                out.push(((acc >> bits) & 0xff) as u8);
            }
        }
        if bits > 0 {
            let pad = 8 - bits;
            out.push((((acc << pad) | ((1 << pad) - 1)) & 0xff) as u8);
        }
        out
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_code_is_complete_and_matches_the_rfc_where_it_lists_codes() {
        let codes = codes();
        // Kraft sum of a complete prefix code is exactly 1: 2^30 in units of 2^-30.
        let kraft: u64 = codes.iter().map(|(_, bits)| 1u64 << (30 - bits)).sum();
        assert_eq!(kraft, 1 << 30);
        assert_eq!(codes[usize::from(b'0')], (0x0, 5));
        assert_eq!(codes[usize::from(b'%')], (0x15, 6));
        assert_eq!(codes[usize::from(b'/')], (0x18, 6));
        assert_eq!(codes[usize::from(b'A')], (0x21, 6));
        assert_eq!(codes[usize::from(b'z')], (0x7b, 7));
        assert_eq!(codes[0], (0x1ff8, 13));
        assert_eq!(codes[255], (0x3ff_ffee, 26));
        assert_eq!(codes[256], (0x3fff_ffff, 30));
    }

    #[test]
    fn rfc_7541_appendix_c_examples_decode() {
        for (coded, text) in [
            ("f1e3c2e5f23a6ba0ab90f4ff", "www.example.com"),
            ("a8eb10649cbf", "no-cache"),
            ("25a849e95ba97d7f", "custom-key"),
            ("25a849e95bb8e8b4bf", "custom-value"),
            ("6402", "302"),
            ("aec3771a4b", "private"),
            (
                "d07abe941054d444a8200595040b8166e082a62d1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29ad171863c78f0b97c8e9ae82ae43d3",
                "https://www.example.com",
            ),
        ] {
            assert_eq!(decode(&hex(coded)).unwrap(), text.as_bytes(), "{text}");
            assert_eq!(encode(text.as_bytes()), hex(coded), "{text}");
        }
    }

    #[test]
    fn every_byte_round_trips_and_bad_padding_is_refused() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        // "0" is 00000 (5 bits): padding of ones is valid, of zeros is not.
        assert_eq!(decode(&[0b0000_0111]).unwrap(), b"0");
        assert_eq!(decode(&[0b0000_0000]).unwrap_err(), InvalidHuffman);
        // A whole byte of padding (more than 7 bits).
        assert_eq!(decode(&[0b0000_0111, 0xff]).unwrap_err(), InvalidHuffman);
        // EOS (30 ones) inside a string.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff]).unwrap_err(),
            InvalidHuffman
        );
    }
}
