//! Sizes in bytes.

/// One MiB.
pub const MIB: u64 = 1 << 20;
/// The largest volume: the last whole MiB below 2^63 bytes (9223372036853727232 bytes, 8Ei
/// minus 1Mi). CSI sizes are signed 64-bit and the Linux block layer stops at 2^63-1 bytes, so
/// a larger image could never be used (librbd itself accepts larger sizes).
pub const MAX_SIZE: u64 = (1 << 63) - MIB;
/// [`MAX_SIZE`] as people read it.
pub const MAX_SIZE_TEXT: &str = "9223372036853727232 bytes (8Ei minus 1Mi)";

/// Whether an image of `size` bytes satisfies `required` (at least) and `limit` (at most; 0 =
/// no limit).
#[must_use]
pub fn fits(size: u64, required: u64, limit: u64) -> bool {
    size >= required && (limit == 0 || size <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_respects_both_bounds() {
        assert!(fits(2 * MIB, MIB, 0));
        assert!(!fits(MIB, 2 * MIB, 0));
        assert!(!fits(3 * MIB, MIB, 2 * MIB));
        assert!(fits(2 * MIB, 2 * MIB, 2 * MIB));
        assert_eq!(MAX_SIZE, 9_223_372_036_853_727_232);
    }
}
