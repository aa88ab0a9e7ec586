//! The little of Ceph's `denc` encoding that the `rbd` object-class calls made here need
//! (little-endian): integers as they are; a string or bufferlist is a `u32` length and its
//! bytes; a map is a `u32` count and its keys and values in order.

use std::collections::BTreeMap;

use crate::error::Error;

/// A string or bufferlist.
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// `map<string, bufferlist>`.
pub(crate) fn put_map(out: &mut Vec<u8>, entries: &[(String, String)]) {
    let count = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for (key, value) in entries {
        put_bytes(out, key.as_bytes());
        put_bytes(out, value.as_bytes());
    }
}

/// Reads an answer front to back; every read is `None` past its end.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }

    /// The next `len` bytes.
    pub(crate) fn raw(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(head)
    }

    /// A length-prefixed string or bufferlist.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        self.raw(len)
    }

    pub(crate) fn string(&mut self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// `map<string, bufferlist>`, values read as text.
    pub(crate) fn map(&mut self) -> Option<BTreeMap<String, String>> {
        let count = self.u32()?;
        let mut out = BTreeMap::new();
        for _ in 0..count {
            let key = self.string()?;
            let value = self.string()?;
            out.insert(key, value);
        }
        Some(out)
    }
}

/// The error for an answer that does not decode.
pub(crate) fn malformed(op: &'static str, target: &str, what: &str) -> Error {
    Error::invalid(
        op,
        target,
        format!("malformed {what} answer from the rbd object class"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_round_trip_in_cephs_encoding() {
        let entries = vec![
            ("provisioner.ceph.com/pv".to_string(), "pvc-1".to_string()),
            ("empty".to_string(), String::new()),
        ];
        let mut bytes = Vec::new();
        put_map(&mut bytes, &entries);
        assert_eq!(&bytes[..4], &2u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &23u32.to_le_bytes());
        let back = Reader(&bytes).map().unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back["provisioner.ceph.com/pv"], "pvc-1");
        assert_eq!(back["empty"], "");
    }

    #[test]
    fn truncated_answers_are_refused_not_misread() {
        let mut bytes = Vec::new();
        put_map(&mut bytes, &[("k".to_string(), "value".to_string())]);
        for cut in 0..bytes.len() {
            assert!(Reader(&bytes[..cut]).map().is_none(), "cut at {cut}");
        }
        assert_eq!(
            Reader(&[3, 0, 0, 0, b'a', b'b', b'c']).string().as_deref(),
            Some("abc")
        );
        assert!(Reader(&[4, 0, 0, 0, b'a']).string().is_none());
        assert_eq!(Reader(&[1, 2, 3]).u32(), None);
    }
}
