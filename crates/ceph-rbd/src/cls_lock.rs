//! Inputs of the `lock` object class's methods (`cls_lock_*_op`, each `ENCODE_START(1, 1)`):
//! the advisory locks RADOS keeps on an object, which librbd's exclusive lock and our creator
//! lock are.

use crate::denc::put_bytes;

/// `LOCK_EXCLUSIVE` of `ClsLockType`.
pub(crate) const EXCLUSIVE: u8 = 1;

/// Version 1, compatible with 1, and the body's length before it.
fn versioned(body: &[u8]) -> Vec<u8> {
    let mut op = vec![1, 1];
    op.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    op.extend_from_slice(body);
    op
}

/// `lock`: lock `name` exclusively with `cookie` and `tag` for `secs` (0: until unlocked), not
/// renewed (a second lock by the same client and cookie is `EEXIST`; by another, `EBUSY`).
pub(crate) fn lock(name: &str, cookie: &str, tag: &str, description: &str, secs: u32) -> Vec<u8> {
    let mut body = Vec::new();
    put_bytes(&mut body, name.as_bytes());
    body.push(EXCLUSIVE);
    put_bytes(&mut body, cookie.as_bytes());
    put_bytes(&mut body, tag.as_bytes());
    put_bytes(&mut body, description.as_bytes());
    body.extend_from_slice(&secs.to_le_bytes()); // utime_t seconds
    body.extend_from_slice(&0u32.to_le_bytes()); // and nanoseconds
    body.push(0); // flags
    versioned(&body)
}

/// `unlock`: this client's lock `name` with `cookie`.
pub(crate) fn unlock(name: &str, cookie: &str) -> Vec<u8> {
    let mut body = Vec::new();
    put_bytes(&mut body, name.as_bytes());
    put_bytes(&mut body, cookie.as_bytes());
    versioned(&body)
}

/// `assert_locked`: the operation it is part of fails (`EBUSY`) unless this client holds
/// `name` exclusively with `cookie` and `tag`.
pub(crate) fn assert_locked(name: &str, cookie: &str, tag: &str) -> Vec<u8> {
    let mut body = Vec::new();
    put_bytes(&mut body, name.as_bytes());
    body.push(EXCLUSIVE);
    put_bytes(&mut body, cookie.as_bytes());
    put_bytes(&mut body, tag.as_bytes());
    versioned(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inputs_are_encoded_as_the_lock_class_decodes_them() {
        let lock = lock("rbd_lock", "auto 7", "internal", "", 0);
        // version, compat, length, then name
        assert_eq!(&lock[..2], &[1, 1]);
        assert_eq!(
            u32::from_le_bytes(lock[2..6].try_into().unwrap()) as usize,
            lock.len() - 6
        );
        assert_eq!(&lock[6..10], &8u32.to_le_bytes());
        assert_eq!(&lock[10..18], b"rbd_lock");
        assert_eq!(lock[18], EXCLUSIVE);
        assert_eq!(&lock[19..23], &6u32.to_le_bytes());
        assert_eq!(&lock[23..29], b"auto 7");
        // the duration and flags close it: 8 bytes of utime_t, 1 of flags
        assert_eq!(&lock[lock.len() - 9..], &[0; 9]);
        let unlock = unlock("rbd_lock", "auto 7");
        assert_eq!(unlock.len(), 6 + 4 + 8 + 4 + 6);
        let assert = assert_locked("rbd_lock", "auto 7", "internal");
        assert_eq!(assert.len(), 6 + 12 + 1 + 10 + 12);
    }
}
