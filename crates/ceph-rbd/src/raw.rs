//! The only module with `unsafe` code: blocking, safe wrappers over librados/librbd handles.
//!
//! Every handle is owned by a Rust value whose `Drop` releases it (`rados_shutdown`,
//! `rados_ioctx_destroy`, `rbd_close`), and borrows tie an image to its I/O context and an I/O
//! context to its cluster handle, so nothing outlives what it depends on. Strings cross the
//! boundary as `CString`s built here; buffers that librbd fills are grown on `-ERANGE`.
//! librados cluster handles are thread-safe (librados' documented contract), so `Rados` is
//! `Send + Sync`; I/O contexts and images are created per operation and stay on one thread.
//! Calls here block: the async layer (`cluster.rs`) runs them on the blocking pool.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::ptr;

use crate::mirror::{
    MirrorGlobalStatus, MirrorImageInfo, MirrorImageState, MirrorMode, MirrorSiteStatus,
    MirrorSnapshot, MirrorStatusState,
};
use crate::{
    ClusterConfig, ClusterStats, CreateOptions, Error, Features, GroupSnapInfo, ImageGroupSnap,
    ImageInfo, Locker, ParentSpec, PoolStats, SnapEntry, SnapInfo, TrashEntry, Watcher,
};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
#[allow(clippy::all, clippy::pedantic)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// An image's mirroring as librbd reports it in `info` (without the mode, read apart).
///
/// # Safety
/// `info.global_id` is the string librbd set and has not released yet.
unsafe fn mirror_info_of(info: &ffi::rbd_mirror_image_info_t) -> MirrorImageInfo {
    MirrorImageInfo {
        // SAFETY: guaranteed by the caller.
        global_id: unsafe { owned(info.global_id) },
        state: match info.state {
            ffi::rbd_mirror_image_state_t_RBD_MIRROR_IMAGE_DISABLING => MirrorImageState::Disabling,
            ffi::rbd_mirror_image_state_t_RBD_MIRROR_IMAGE_ENABLED => MirrorImageState::Enabled,
            _ => MirrorImageState::Disabled,
        },
        primary: info.primary,
        snapshot_mode: None,
    }
}

fn cstring(value: &str, op: &'static str, target: &str) -> Result<CString, Error> {
    CString::new(value).map_err(|_| Error::invalid(op, target, "name contains a NUL byte"))
}

fn check(rc: c_int, op: &'static str, target: &str) -> Result<c_int, Error> {
    if rc < 0 {
        Err(Error::from_errno(rc, op, target))
    } else {
        Ok(rc)
    }
}

/// Copies a C string owned by librbd; `None` for a null pointer.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the duration of the call.
unsafe fn owned(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Calls `fill(buf, &mut len)` with a buffer grown until librbd stops answering `-ERANGE`.
fn with_buffer<T>(
    op: &'static str,
    target: &str,
    initial: usize,
    mut fill: impl FnMut(*mut c_char, &mut usize) -> c_int,
    decode: impl FnOnce(&[u8]) -> T,
) -> Result<T, Error> {
    let mut len = initial;
    for _ in 0..8 {
        let mut buf = vec![0u8; len.max(1)];
        let mut wanted = buf.len();
        let rc = fill(buf.as_mut_ptr().cast(), &mut wanted);
        if rc == -libc::ERANGE {
            len = wanted.max(len * 2);
            continue;
        }
        check(rc, op, target)?;
        buf.truncate(wanted.min(buf.len()));
        return Ok(decode(&buf));
    }
    Err(Error::from_errno(-libc::ERANGE, op, target))
}

/// The NUL-terminated strings packed in `buf` (librbd's list format). An empty string is an
/// entry of its own (a lone NUL): dropping it would shift every later entry.
fn nul_terminated(buf: &[u8]) -> Vec<String> {
    buf.split_inclusive(|b| *b == 0)
        .filter(|s| s.last() == Some(&0))
        .map(|s| String::from_utf8_lossy(&s[..s.len() - 1]).into_owned())
        .collect()
}

/// Pairs `rbd_metadata_list`'s keys and values; `None` when their counts differ.
fn metadata_pairs(keys: &[u8], vals: &[u8]) -> Option<BTreeMap<String, String>> {
    let (keys, vals) = (nul_terminated(keys), nul_terminated(vals));
    (keys.len() == vals.len()).then(|| keys.into_iter().zip(vals).collect())
}

/// A librbd `struct timespec` as a time.
fn system_time(ts: &libc::timespec) -> std::time::SystemTime {
    std::time::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
}

/// Text up to the first NUL.
fn c_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The Ceph release of the loaded client libraries: libceph-common's `ceph_version_to_str()`
/// (a C++ symbol every release since Luminous exports), else librbd's API version.
pub(crate) fn client_version() -> String {
    const SYMBOL: &[u8] = b"_Z19ceph_version_to_strv\0";
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up; the
    // libraries librados pulled in at startup are in the global scope.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr().cast()) };
    if !found.is_null() {
        // SAFETY: the symbol is `const char *ceph_version_to_str()`, taking nothing and
        // returning a static NUL-terminated string.
        let version =
            unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> *const c_char>(found) };
        let text = version();
        if !text.is_null() {
            // SAFETY: a static NUL-terminated string (see above).
            let text = unsafe { CStr::from_ptr(text) };
            return text.to_string_lossy().into_owned();
        }
    }
    let (mut major, mut minor, mut extra) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    unsafe { ffi::rbd_version(&mut major, &mut minor, &mut extra) };
    format!("librbd {major}.{minor}.{extra}")
}

/// A connected cluster handle (`rados_t`).
pub(crate) struct Rados {
    handle: ffi::rados_t,
    target: String,
    /// What the cluster supports, probed at the first operation that asks ([`Rados::compat`]).
    compat: std::sync::OnceLock<crate::compat::Compat>,
}

// SAFETY: a connected rados_t may be used from any thread concurrently (librados is thread-safe);
// it is only shut down in Drop, when no borrow remains.
unsafe impl Send for Rados {}
// SAFETY: as above.
unsafe impl Sync for Rados {}

impl Rados {
    /// Connects with the monitors, user and key of `cfg`, reading no ceph.conf or keyring.
    pub(crate) fn connect(cfg: &ClusterConfig) -> Result<Rados, Error> {
        let target = format!("client.{}@{}", cfg.user, cfg.monitors);
        let op = "connect";
        // A malformed key is named before anything is sent: a client that reads aes256k keys
        // (19.2.6 on) accepts a cut-short key and the monitors only answer "permission denied".
        if let Err(reason) = crate::key::key_type(cfg.key.expose()) {
            return Err(Error::invalid(
                op,
                &target,
                format!("the key is malformed: {reason}"),
            ));
        }
        let user = cstring(&cfg.user, op, &target)?;
        let mut handle: ffi::rados_t = ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `user` outlives the call.
        check(
            unsafe { ffi::rados_create(&mut handle, user.as_ptr()) },
            op,
            &target,
        )?;
        // From here on Drop shuts the handle down, also on the error paths below.
        let rados = Rados {
            handle,
            target,
            compat: std::sync::OnceLock::new(),
        };
        let secs = |d: std::time::Duration| d.as_secs().max(1).to_string();
        let settings = [
            ("mon_host", cfg.monitors.clone()),
            ("key", cfg.key.expose().to_string()),
            ("keyring", String::new()),
            ("client_mount_timeout", secs(cfg.connect_timeout)),
            // Mon commands may time out safely. OSD ops may not: librbd does not survive an op
            // timing out under it (it asserts on close), so a stuck OSD op is bounded by the
            // async layer's deadline instead, and completes or fails on its own later.
            ("rados_mon_op_timeout", secs(cfg.op_timeout)),
            // a client in a container has no /var/run/ceph: no admin socket, no log file
            ("admin_socket", String::new()),
            ("log_file", String::new()),
            ("log_to_stderr", "false".into()),
        ];
        // CEPH_ARGS, as the ceph and rbd commands read it (`--name=value` or `--name value`):
        // for a client log while debugging (`--log_file=... --debug_rbd=20`). Set after the
        // settings above, so that it may override them.
        let from_env = std::env::var_os("CEPH_ARGS")
            .map(|args| ceph_args(&args.to_string_lossy()))
            .unwrap_or_default();
        let settings = settings
            .into_iter()
            .map(|(name, value)| ("", name.to_owned(), value))
            .chain(
                from_env
                    .into_iter()
                    .map(|(name, value)| ("CEPH_ARGS: ", name, value)),
            );
        for (origin, name, value) in settings {
            let c_name = cstring(&name, op, &rados.target)?;
            let c_value = cstring(&value, op, &rados.target)?;
            // SAFETY: valid handle and NUL-terminated strings that outlive the call.
            let rc =
                unsafe { ffi::rados_conf_set(rados.handle, c_name.as_ptr(), c_value.as_ptr()) };
            if rc < 0 {
                // never echo the value: one of them is the key
                return Err(Error::invalid(
                    op,
                    &rados.target,
                    format!("{origin}setting {name} was refused (errno {})", -rc),
                ));
            }
        }
        // SAFETY: configured handle; blocks until connected or client_mount_timeout.
        let rc = unsafe { ffi::rados_connect(rados.handle) };
        // only now: OpenSSL registered its own exit cleanup while this connected
        crate::lifecycle::shutdown_at_exit();
        if rc == -libc::EINVAL {
            // librados parses the key only now and says no more than EINVAL: say why
            if let Some(reason) = crate::key::refusal_reason(cfg.key.expose()) {
                return Err(Error::invalid(op, &rados.target, reason));
            }
        }
        check(rc, op, &rados.target)?;
        Ok(rados)
    }

    /// The names of the cluster's pools.
    pub(crate) fn pool_list(&self) -> Result<Vec<String>, Error> {
        let op = "list pools";
        let mut len = 4096usize;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: connected handle; `buf` is valid for `len` bytes. The call writes
            // NUL-separated names ending in an empty one and returns the length it needs.
            let rc = unsafe { ffi::rados_pool_list(self.handle, buf.as_mut_ptr().cast(), len) };
            let needed = usize::try_from(check(rc, op, &self.target)?).unwrap_or(0);
            if needed > len {
                len = needed;
                continue;
            }
            buf.truncate(needed);
            return Ok(buf
                .split(|b| *b == 0)
                .filter(|name| !name.is_empty())
                .map(|name| String::from_utf8_lossy(name).into_owned())
                .collect());
        }
    }

    /// An I/O context on `spec`, a pool name or `pool/namespace` (see [`crate::namespace`]).
    pub(crate) fn ioctx(&self, spec: &str) -> Result<IoCtx<'_>, Error> {
        let (pool, namespace) = crate::namespace::split_pool_spec(spec)
            .map_err(|reason| Error::invalid("open pool", spec, reason))?;
        let c_pool = cstring(pool, "open pool", spec)?;
        let c_namespace = cstring(namespace, "open pool", spec)?;
        let mut handle: ffi::rados_ioctx_t = ptr::null_mut();
        // SAFETY: connected handle, valid out-pointer and string.
        check(
            unsafe { ffi::rados_ioctx_create(self.handle, c_pool.as_ptr(), &mut handle) },
            "open pool",
            spec,
        )?;
        let io = IoCtx {
            handle,
            pool: spec.to_string(),
            rados: self,
        };
        if !namespace.is_empty() {
            // SAFETY: valid ioctx and string; librados copies the name.
            unsafe { ffi::rados_ioctx_set_namespace(io.handle, c_namespace.as_ptr()) };
        }
        Ok(io)
    }

    /// The name of the pool whose ID is `id` (from the client's OSD map, no round trip).
    pub(crate) fn pool_name(&self, id: i64) -> Result<String, Error> {
        let op = "look up pool";
        let target = format!("pool id {id}");
        let mut buf = vec![0u8; 256];
        // SAFETY: connected handle; `buf` is valid for its length; librados writes a
        // NUL-terminated name or returns a negative errno (ERANGE: too short, ENOENT).
        let rc = unsafe {
            ffi::rados_pool_reverse_lookup(self.handle, id, buf.as_mut_ptr().cast(), buf.len())
        };
        check(rc, op, &target)?;
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// What an earlier probe found, without probing.
    pub(crate) fn known_compat(&self) -> Option<crate::compat::Compat> {
        self.compat.get().cloned()
    }

    /// What the cluster supports, probed once per connection (see [`crate::compat`]); a probe
    /// the monitors did not answer (a timeout) is made again at the next call.
    pub(crate) fn compat(&self) -> crate::compat::Compat {
        if let Some(known) = self.compat.get() {
            return known.clone();
        }
        let (compat, settled) = crate::compat::probe(self);
        if settled {
            // another thread may have probed meanwhile: the same answer
            let _ = self.compat.set(compat.clone());
        }
        compat
    }

    /// The client's value of configuration option `key` (as set here, or by the monitors'
    /// central configuration).
    pub(crate) fn conf_get(&self, op: &'static str, key: &str) -> Result<String, Error> {
        let c_key = cstring(key, op, &self.target)?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: connected handle; `buf` is valid for its length.
        let rc = unsafe {
            ffi::rados_conf_get(
                self.handle,
                c_key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        check(rc, op, &self.target)?;
        Ok(c_text(&buf))
    }

    /// A monitor command (`cmd`: its JSON) and its answer (the output buffer); a refusal (a
    /// negative return code) is the error.
    pub(crate) fn mon_command_answer(&self, op: &'static str, cmd: &str) -> Result<Vec<u8>, Error> {
        let (rc, out, _status) = self.mon_command(cmd)?;
        check(rc, op, &self.target)?;
        Ok(out.into_bytes())
    }

    /// The cluster's fsid (from the monmap of the connected handle).
    pub(crate) fn fsid(&self) -> Result<String, Error> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: connected handle; `buf` is writable for its whole length, which is passed.
        let rc = unsafe { ffi::rados_cluster_fsid(self.handle, buf.as_mut_ptr(), buf.len()) };
        check(rc, "read cluster fsid", &self.target)?;
        // SAFETY: librados NUL-terminates the fsid within the buffer on success.
        let fsid = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(fsid.to_string_lossy().into_owned())
    }

    /// Sends one monitor command (its JSON form, `{"prefix": "osd blocklist", ...}`) and
    /// returns the return code, the output buffer and the status string, as `ceph` prints them.
    /// A negative return code is returned, not turned into an error: the status says why.
    pub(crate) fn mon_command(&self, command: &str) -> Result<(i32, String, String), Error> {
        let op = "monitor command";
        let c_command = cstring(command, op, &self.target)?;
        let commands = [c_command.as_ptr()];
        let mut out: *mut c_char = ptr::null_mut();
        let mut out_len: usize = 0;
        let mut status: *mut c_char = ptr::null_mut();
        let mut status_len: usize = 0;
        // SAFETY: connected handle; one NUL-terminated command that outlives the call; the out
        // pointers are valid and what librados puts there is freed below with
        // rados_buffer_free.
        let rc = unsafe {
            ffi::rados_mon_command(
                self.handle,
                commands.as_ptr().cast_mut(),
                commands.len(),
                ptr::null(),
                0,
                &mut out,
                &mut out_len,
                &mut status,
                &mut status_len,
            )
        };
        let take = |p: *mut c_char, len: usize| -> String {
            if p.is_null() {
                return String::new();
            }
            // SAFETY: librados allocated `len` bytes at `p` for us; they are copied, then freed.
            let text = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
            let text = String::from_utf8_lossy(text).into_owned();
            // SAFETY: a buffer librados returned, freed once.
            unsafe { ffi::rados_buffer_free(p) };
            text
        };
        let out = take(out, out_len);
        let status = take(status, status_len);
        Ok((rc, out, status))
    }

    /// This client instance's global ID (`client.<id>`), as watchers and lockers name it.
    pub(crate) fn instance_id(&self) -> u64 {
        // SAFETY: connected handle.
        unsafe { ffi::rados_get_instance_id(self.handle) }
    }

    pub(crate) fn cluster_stats(&self) -> Result<ClusterStats, Error> {
        let mut st = ffi::rados_cluster_stat_t {
            kb: 0,
            kb_used: 0,
            kb_avail: 0,
            num_objects: 0,
        };
        // SAFETY: connected handle and a valid out-struct.
        check(
            unsafe { ffi::rados_cluster_stat(self.handle, &mut st) },
            "cluster stats",
            &self.target,
        )?;
        Ok(ClusterStats {
            total_bytes: st.kb * 1024,
            used_bytes: st.kb_used * 1024,
            avail_bytes: st.kb_avail * 1024,
        })
    }
}

/// A `rados_t` on its way to the reaper thread.
struct Handle(ffi::rados_t);

// SAFETY: a rados_t may be shut down from any thread once nothing else uses it.
unsafe impl Send for Handle {}

impl Drop for Rados {
    fn drop(&mut self) {
        let handle = Handle(self.handle);
        // rados_shutdown joins Ceph's threads and may block for long: never on an async worker
        // or under a lock, so it runs on the reaper thread.
        crate::lifecycle::close_later(Box::new(move || {
            let handle = handle;
            // SAFETY: the handle came from rados_create, no borrow of it remains (IoCtx and
            // Image borrow the Rados being dropped), and it is shut down exactly once.
            unsafe { ffi::rados_shutdown(handle.0) };
        }));
    }
}

/// An I/O context on one pool (`rados_ioctx_t`).
pub(crate) struct IoCtx<'a> {
    handle: ffi::rados_ioctx_t,
    pool: String,
    rados: &'a Rados,
}

impl Drop for IoCtx<'_> {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; destroyed once, before its cluster handle.
        unsafe { ffi::rados_ioctx_destroy(self.handle) };
    }
}

/// librbd calls the progress callback unconditionally: a null one would crash.
extern "C" fn no_progress(_offset: u64, _total: u64, _arg: *mut c_void) -> c_int {
    0
}

/// `rbd_diff_iterate2` callback: adds the length of each extent that exists to the `u64` that
/// `arg` points to.
extern "C" fn count_used(_offset: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    if exists != 0 {
        // SAFETY: `arg` is the `&mut u64` that `Image::used_bytes` passes, alive for the call.
        let used = unsafe { &mut *arg.cast::<u64>() };
        *used = used.saturating_add(len as u64);
    }
    0
}

/// `rbd_image_options_t`, destroyed on drop.
struct ImageOptions(ffi::rbd_image_options_t);

impl ImageOptions {
    fn new(opts: &CreateOptions, op: &'static str, target: &str) -> Result<ImageOptions, Error> {
        let mut handle: ffi::rbd_image_options_t = ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { ffi::rbd_image_options_create(&mut handle) };
        let o = ImageOptions(handle);
        o.set_u64(
            ffi::RBD_IMAGE_OPTION_FORMAT,
            u64::from(opts.format.unwrap_or(2)),
            op,
            target,
        )?;
        if let Some(features) = opts.features {
            features.validate()?;
            o.set_u64(ffi::RBD_IMAGE_OPTION_FEATURES, features.bits(), op, target)?;
        }
        if let Some(size) = opts.object_size {
            if !size.is_power_of_two() || !(4096..=(32 << 20)).contains(&size) {
                return Err(Error::invalid(
                    op,
                    target,
                    format!("object size {size} must be a power of two between 4 KiB and 32 MiB"),
                ));
            }
            o.set_u64(
                ffi::RBD_IMAGE_OPTION_ORDER,
                u64::from(size.trailing_zeros()),
                op,
                target,
            )?;
        }
        if let Some(unit) = opts.stripe_unit {
            o.set_u64(ffi::RBD_IMAGE_OPTION_STRIPE_UNIT, unit, op, target)?;
        }
        if let Some(count) = opts.stripe_count {
            o.set_u64(ffi::RBD_IMAGE_OPTION_STRIPE_COUNT, count, op, target)?;
        }

        if let Some(pool) = &opts.data_pool {
            let c_pool = cstring(pool, op, target)?;
            // SAFETY: valid options handle and string.
            let rc = unsafe {
                ffi::rbd_image_options_set_string(
                    o.0,
                    ffi::RBD_IMAGE_OPTION_DATA_POOL as c_int,
                    c_pool.as_ptr(),
                )
            };
            check(rc, op, target)?;
        }
        Ok(o)
    }

    fn set_u64(&self, name: u32, value: u64, op: &'static str, target: &str) -> Result<(), Error> {
        // SAFETY: valid options handle.
        check(
            unsafe { ffi::rbd_image_options_set_uint64(self.0, name as c_int, value) },
            op,
            target,
        )
        .map(drop)
    }
}

impl Drop for ImageOptions {
    fn drop(&mut self) {
        // SAFETY: created by rbd_image_options_create, destroyed once.
        unsafe { ffi::rbd_image_options_destroy(self.0) };
    }
}

impl IoCtx<'_> {
    /// Calls librbd's `(ioctx, group name)` functions.
    fn group_call(
        &self,
        op: &'static str,
        group: &str,
        f: unsafe extern "C" fn(ffi::rados_ioctx_t, *const c_char) -> c_int,
    ) -> Result<(), Error> {
        let target = format!("{}/group:{group}", self.pool);
        let c_group = cstring(group, op, &target)?;
        // SAFETY: `f` is rbd_group_create or rbd_group_remove; valid ioctx and string.
        check(unsafe { f(self.handle, c_group.as_ptr()) }, op, &target).map(drop)
    }

    /// Whether the RBD namespace `name` exists in this pool (`rbd_namespace_exists`).
    pub(crate) fn namespace_exists(&self, name: &str) -> Result<bool, Error> {
        let op = "check namespace";
        let target = format!("{}/{name}", self.pool);
        let c_name = cstring(name, op, &target)?;
        let mut exists = false;
        // SAFETY: valid ioctx, string and out-pointer.
        check(
            unsafe { ffi::rbd_namespace_exists(self.handle, c_name.as_ptr(), &mut exists) },
            op,
            &target,
        )?;
        Ok(exists)
    }

    /// Creates the RBD namespace `name` in this pool (`rbd_namespace_create`).
    pub(crate) fn namespace_create(&self, name: &str) -> Result<(), Error> {
        let op = "create namespace";
        let target = format!("{}/{name}", self.pool);
        let c_name = cstring(name, op, &target)?;
        // SAFETY: valid ioctx and string.
        check(
            unsafe { ffi::rbd_namespace_create(self.handle, c_name.as_ptr()) },
            op,
            &target,
        )
        .map(drop)
    }

    /// The RBD namespaces of this pool (`rbd_namespace_list`).
    pub(crate) fn namespace_list(&self) -> Result<Vec<String>, Error> {
        with_buffer(
            "list namespaces",
            &self.pool,
            256,
            // SAFETY: a buffer of `len` bytes.
            |buf, len| unsafe { ffi::rbd_namespace_list(self.handle, buf, len) },
            |buf| {
                nul_terminated(buf)
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect()
            },
        )
    }

    /// The RBD namespace this context works in (empty: the pool's default one).
    pub(crate) fn namespace(&self) -> &str {
        crate::namespace::split_pool_spec(&self.pool).map_or("", |(_, namespace)| namespace)
    }

    /// The pool's ID.
    pub(crate) fn mirror_mode(&self) -> Result<MirrorMode, Error> {
        let op = "read mirroring mode";
        let mut mode: ffi::rbd_mirror_mode_t = ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_DISABLED;
        // SAFETY: valid ioctx and an out-value.
        check(
            unsafe { ffi::rbd_mirror_mode_get(self.handle, &mut mode) },
            op,
            &self.pool,
        )?;
        match mode {
            ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_DISABLED => Ok(MirrorMode::Disabled),
            ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_IMAGE => Ok(MirrorMode::Image),
            ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_POOL => Ok(MirrorMode::Pool),
            other => Err(Error::invalid(
                op,
                &self.pool,
                format!("unknown mirroring mode {other}"),
            )),
        }
    }

    pub(crate) fn set_mirror_mode(&self, mode: MirrorMode) -> Result<(), Error> {
        let mode = match mode {
            MirrorMode::Disabled => ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_DISABLED,
            MirrorMode::Image => ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_IMAGE,
            MirrorMode::Pool => ffi::rbd_mirror_mode_t_RBD_MIRROR_MODE_POOL,
        };
        // SAFETY: valid ioctx.
        check(
            unsafe { ffi::rbd_mirror_mode_set(self.handle, mode) },
            "set mirroring mode",
            &self.pool,
        )
        .map(drop)
    }

    pub(crate) fn pool_id(&self) -> i64 {
        // SAFETY: valid ioctx.
        unsafe { ffi::rados_ioctx_get_id(self.handle) }
    }

    pub(crate) fn group_create(&self, group: &str) -> Result<(), Error> {
        self.group_call("create group", group, ffi::rbd_group_create)
    }

    pub(crate) fn group_remove(&self, group: &str) -> Result<(), Error> {
        self.group_call("remove group", group, ffi::rbd_group_remove)
    }

    /// Adds (`add`) or removes `image_io`'s `image` to or from `group`.
    pub(crate) fn group_image(
        &self,
        group: &str,
        image_io: &IoCtx<'_>,
        image: &str,
        add: bool,
    ) -> Result<(), Error> {
        let op = if add {
            "add image to group"
        } else {
            "remove image from group"
        };
        let target = format!("{}/group:{group} {}", self.pool, image_io.spec(image));
        let (g, i) = (cstring(group, op, &target)?, cstring(image, op, &target)?);
        // SAFETY: valid ioctxs and strings.
        let rc = unsafe {
            if add {
                ffi::rbd_group_image_add(self.handle, g.as_ptr(), image_io.handle, i.as_ptr())
            } else {
                ffi::rbd_group_image_remove(self.handle, g.as_ptr(), image_io.handle, i.as_ptr())
            }
        };
        check(rc, op, &target).map(drop)
    }

    /// Creates (`create`) or removes snapshot `snap` of every image of `group` at once
    /// (crash-consistent: writes to the group's images are quiesced together).
    pub(crate) fn group_snap(&self, group: &str, snap: &str, create: bool) -> Result<(), Error> {
        let op = if create {
            "create group snapshot"
        } else {
            "remove group snapshot"
        };
        let target = format!("{}/group:{group}@{snap}", self.pool);
        let (g, n) = (cstring(group, op, &target)?, cstring(snap, op, &target)?);
        // SAFETY: valid ioctx and strings.
        let rc = unsafe {
            if create {
                ffi::rbd_group_snap_create(self.handle, g.as_ptr(), n.as_ptr())
            } else {
                ffi::rbd_group_snap_remove(self.handle, g.as_ptr(), n.as_ptr())
            }
        };
        check(rc, op, &target).map(drop)
    }

    pub(crate) fn group_snap_list(&self, group: &str) -> Result<Vec<GroupSnapInfo>, Error> {
        let op = "list group snapshots";
        let target = format!("{}/group:{group}", self.pool);
        let c_group = cstring(group, op, &target)?;
        let size = std::mem::size_of::<ffi::rbd_group_snap_info_t>();
        let mut max: usize = 16;
        for _ in 0..8 {
            // SAFETY: plain C structs: all-zero is a valid value.
            let mut snaps: Vec<ffi::rbd_group_snap_info_t> =
                (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
            let mut n = max;
            // SAFETY: room for `n` entries of `size` bytes.
            let rc = unsafe {
                ffi::rbd_group_snap_list(
                    self.handle,
                    c_group.as_ptr(),
                    snaps.as_mut_ptr(),
                    size,
                    &mut n,
                )
            };
            if rc == -libc::ERANGE {
                max = n.max(max * 2);
                continue;
            }
            check(rc, op, &target)?;
            let count = n.min(snaps.len());
            let list = snaps[..count]
                .iter()
                .map(|s| GroupSnapInfo {
                    // SAFETY: names librbd set, valid until the cleanup below.
                    name: unsafe { owned(s.name) },
                    complete: s.state == ffi::rbd_group_snap_state_t_RBD_GROUP_SNAP_STATE_COMPLETE,
                })
                .collect();
            // SAFETY: releases the `count` entries librbd filled, once.
            unsafe { ffi::rbd_group_snap_list_cleanup(snaps.as_mut_ptr(), size, count) };
            return Ok(list);
        }
        Err(Error::from_errno(-libc::ERANGE, op, &target))
    }

    fn spec(&self, image: &str) -> String {
        format!("{}/{}", self.pool, image)
    }

    pub(crate) fn create_image(
        &self,
        name: &str,
        size: u64,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        let op = "create image";
        let target = self.spec(name);
        let c_name = cstring(name, op, &target)?;
        let options = ImageOptions::new(opts, op, &target)?;
        // SAFETY: valid ioctx, name and options.
        check(
            unsafe { ffi::rbd_create4(self.handle, c_name.as_ptr(), size, options.0) },
            op,
            &target,
        )
        .map(drop)
    }

    pub(crate) fn clone_image(
        &self,
        parent: &str,
        snap: &str,
        dest: &IoCtx<'_>,
        dest_name: &str,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        let op = "clone image";
        let target = format!("{}@{snap} -> {}", self.spec(parent), dest.spec(dest_name));
        let (p, s, d) = (
            cstring(parent, op, &target)?,
            cstring(snap, op, &target)?,
            cstring(dest_name, op, &target)?,
        );
        let options = ImageOptions::new(opts, op, &target)?;
        // The clone format the client's `rbd_default_clone_format` gives (`auto`: v2 only when
        // the cluster requires Mimic or later clients), said explicitly so that librbd and
        // this crate agree on it. v2: the parent snapshot needs no protection and may be
        // removed while clones of it exist (it waits in the snapshot trash until none needs
        // it). v1: the parent snapshot must be protected (librbd refuses otherwise), and
        // cannot be unprotected or removed until its clones are flattened or removed.
        let format = self.compat().clone_format;
        if format == crate::compat::CloneFormat::V1 {
            let parent_image = self.open(parent, false)?;
            if !parent_image.snap_is_protected(snap)? {
                match parent_image.snap_protect(snap) {
                    Ok(()) => {}
                    // protected meanwhile by another client
                    Err(Error::Busy { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        options.set_u64(
            ffi::RBD_IMAGE_OPTION_CLONE_FORMAT,
            format.number(),
            op,
            &target,
        )?;
        // SAFETY: valid ioctxs, strings and options.
        let rc = unsafe {
            ffi::rbd_clone3(
                self.handle,
                p.as_ptr(),
                s.as_ptr(),
                dest.handle,
                d.as_ptr(),
                options.0,
            )
        };
        check(rc, op, &target)?;
        if format == crate::compat::CloneFormat::V1 {
            crate::steps::hit(crate::steps::CLONE_V1_MADE, &dest.spec(dest_name));
        }
        Ok(())
    }

    /// What the cluster supports (probed once per connection).
    pub(crate) fn compat(&self) -> crate::compat::Compat {
        self.rados.compat()
    }

    pub(crate) fn open(&self, name: &str, read_only: bool) -> Result<Image<'_>, Error> {
        let op = "open image";
        let target = self.spec(name);
        let c_name = cstring(name, op, &target)?;
        let mut handle: ffi::rbd_image_t = ptr::null_mut();
        // SAFETY: valid ioctx, name and out-pointer; no snapshot.
        let rc = unsafe {
            if read_only {
                ffi::rbd_open_read_only(self.handle, c_name.as_ptr(), &mut handle, ptr::null())
            } else {
                ffi::rbd_open(self.handle, c_name.as_ptr(), &mut handle, ptr::null())
            }
        };
        check(rc, op, &target)?;
        Ok(Image {
            handle,
            target,
            _io: PhantomData,
        })
    }

    pub(crate) fn remove_image(&self, name: &str) -> Result<(), Error> {
        let op = "remove image";
        let target = self.spec(name);
        let c_name = cstring(name, op, &target)?;
        // SAFETY: valid ioctx and name. A progress callback is required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_remove_with_progress(
                self.handle,
                c_name.as_ptr(),
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, op, &target).map(drop)
    }

    /// Calls the object-class method `class.method` on object `oid` of this pool (`rados_exec`)
    /// and returns its output. `target` names what the call is about in errors.
    pub(crate) fn exec(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
        class: &str,
        method: &str,
        input: &[u8],
    ) -> Result<Vec<u8>, Error> {
        let c_oid = cstring(oid, op, target)?;
        let c_class = cstring(class, op, target)?;
        let c_method = cstring(method, op, target)?;
        let mut len = 4096usize;
        for _ in 0..8 {
            let mut buf = vec![0u8; len];
            // SAFETY: valid ioctx and strings; `input` and `buf` are valid for their lengths.
            let rc = unsafe {
                ffi::rados_exec(
                    self.handle,
                    c_oid.as_ptr(),
                    c_class.as_ptr(),
                    c_method.as_ptr(),
                    input.as_ptr().cast(),
                    input.len(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if rc == -libc::ERANGE {
                len *= 4;
                continue;
            }
            let n = check(rc, op, target)?;
            buf.truncate(usize::try_from(n).unwrap_or(0).min(buf.len()));
            return Ok(buf);
        }
        Err(Error::from_errno(-libc::ERANGE, op, target))
    }

    /// An I/O context on the same pool, in its default namespace (where pool-wide settings live:
    /// `rbd_info`).
    pub(crate) fn default_namespace(&self) -> Result<IoCtx<'_>, Error> {
        let mut handle: ffi::rados_ioctx_t = ptr::null_mut();
        // SAFETY: valid ioctx; its cluster handle outlives the borrow of `self`; valid out-pointer.
        check(
            unsafe {
                ffi::rados_ioctx_create2(
                    ffi::rados_ioctx_get_cluster(self.handle),
                    ffi::rados_ioctx_get_id(self.handle),
                    &mut handle,
                )
            },
            "open pool",
            &self.pool,
        )?;
        let pool = crate::namespace::split_pool_spec(&self.pool)
            .map(|(pool, _)| pool.to_string())
            .unwrap_or_else(|_| self.pool.clone());
        Ok(IoCtx {
            handle,
            pool,
            rados: self.rados,
        })
    }

    /// The client's value of configuration option `key` (as set here, or by the monitors'
    /// central configuration).
    pub(crate) fn conf_get(&self, op: &'static str, key: &str) -> Result<String, Error> {
        let c_key = cstring(key, op, &self.pool)?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: valid ioctx and its cluster handle; `buf` is valid for its length.
        let rc = unsafe {
            ffi::rados_conf_get(
                ffi::rados_ioctx_get_cluster(self.handle),
                c_key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        check(rc, op, &self.pool)?;
        Ok(c_text(&buf))
    }

    /// This client's instance ID (its global ID with the monitors): unique per connection.
    pub(crate) fn instance_id(&self) -> u64 {
        // SAFETY: valid ioctx and its connected cluster handle.
        unsafe { ffi::rados_get_instance_id(ffi::rados_ioctx_get_cluster(self.handle)) }
    }

    /// Up to `max` bytes of object `oid` from its start.
    pub(crate) fn read(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
        max: usize,
    ) -> Result<Vec<u8>, Error> {
        let c_oid = cstring(oid, op, target)?;
        let mut buf = vec![0u8; max];
        // SAFETY: valid ioctx and name; `buf` is valid for its length.
        let rc = unsafe {
            ffi::rados_read(
                self.handle,
                c_oid.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        };
        let n = check(rc, op, target)?;
        buf.truncate(usize::try_from(n).unwrap_or(0));
        Ok(buf)
    }

    /// The values of the omap keys `keys` of object `oid` (a key that is not set is absent
    /// from the map); `ENOENT` when the object does not exist.
    pub(crate) fn omap_get(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
        keys: &[&str],
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, Error> {
        let c_oid = cstring(oid, op, target)?;
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr().cast()).collect();
        let key_lens: Vec<usize> = keys.iter().map(|k| k.len()).collect();
        // SAFETY: a new read op, released below exactly once.
        let read = unsafe { ffi::rados_create_read_op() };
        if read.is_null() {
            return Err(Error::from_errno(-libc::ENOMEM, op, target));
        }
        let mut iter: ffi::rados_omap_iter_t = ptr::null_mut();
        let mut prval: c_int = 0;
        // SAFETY: `read` is valid; the keys (with their lengths: no NUL needed), the iterator
        // and prval outlive the operation below.
        unsafe {
            ffi::rados_read_op_omap_get_vals_by_keys2(
                read,
                key_ptrs.as_ptr(),
                keys.len(),
                key_lens.as_ptr(),
                &raw mut iter,
                &raw mut prval,
            );
        }
        // SAFETY: valid op, ioctx and name; synchronous.
        let rc = unsafe { ffi::rados_read_op_operate(read, self.handle, c_oid.as_ptr(), 0) };
        let result = check(rc, op, target)
            .and_then(|_| check(prval, op, target))
            .and_then(|_| {
                let mut out = std::collections::BTreeMap::new();
                loop {
                    let (mut key, mut val): (*mut c_char, *mut c_char) =
                        (ptr::null_mut(), ptr::null_mut());
                    let (mut key_len, mut val_len) = (0usize, 0usize);
                    // SAFETY: `iter` was filled by the completed operation; the out-pointers
                    // are valid; the returned buffers live until the iterator ends.
                    let rc = unsafe {
                        ffi::rados_omap_get_next2(
                            iter,
                            &raw mut key,
                            &raw mut val,
                            &raw mut key_len,
                            &raw mut val_len,
                        )
                    };
                    check(rc, op, target)?;
                    if key.is_null() {
                        break;
                    }
                    // SAFETY: librados hands out `key_len` and `val_len` valid bytes.
                    let k = unsafe { std::slice::from_raw_parts(key.cast::<u8>(), key_len) };
                    let v = if val.is_null() {
                        Vec::new()
                    } else {
                        // SAFETY: as above.
                        unsafe { std::slice::from_raw_parts(val.cast::<u8>(), val_len) }.to_vec()
                    };
                    out.insert(String::from_utf8_lossy(k).into_owned(), v);
                }
                Ok(out)
            });
        if !iter.is_null() {
            // SAFETY: the iterator of this operation, ended once.
            unsafe { ffi::rados_omap_get_end(iter) };
        }
        // SAFETY: created above, released once, after it completed.
        unsafe { ffi::rados_release_read_op(read) };
        result
    }

    /// Applies `steps` to object `oid` in one atomic operation: all of them or none.
    pub(crate) fn write_op(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
        steps: &[WriteStep<'_>],
    ) -> Result<(), Error> {
        let c_oid = cstring(oid, op, target)?;
        let mut names = Vec::new();
        for step in steps {
            if let WriteStep::Exec { class, method, .. } = step {
                names.push((cstring(class, op, target)?, cstring(method, op, target)?));
            }
        }
        let mut prvals = vec![0 as c_int; steps.len()];
        // SAFETY: a new write op, released below exactly once.
        let write = unsafe { ffi::rados_create_write_op() };
        if write.is_null() {
            return Err(Error::from_errno(-libc::ENOMEM, op, target));
        }
        let mut names_iter = names.iter();
        for (step, prval) in steps.iter().zip(prvals.iter_mut()) {
            // SAFETY: `write` is valid; every pointer handed over (names, inputs, prval) lives
            // until the operation below completes.
            unsafe {
                match step {
                    WriteStep::CreateExclusive => ffi::rados_write_op_create(
                        write,
                        ffi::LIBRADOS_CREATE_EXCLUSIVE as c_int,
                        ptr::null(),
                    ),
                    WriteStep::AssertExists => ffi::rados_write_op_assert_exists(write),
                    WriteStep::OmapEquals { key, value } => ffi::rados_write_op_omap_cmp2(
                        write,
                        key.as_ptr().cast(),
                        ffi::LIBRADOS_CMPXATTR_OP_EQ as u8,
                        value.as_ptr().cast(),
                        key.len(),
                        value.len(),
                        prval,
                    ),
                    WriteStep::Exec { input, .. } => {
                        if let Some((class, method)) = names_iter.next() {
                            ffi::rados_write_op_exec(
                                write,
                                class.as_ptr(),
                                method.as_ptr(),
                                input.as_ptr().cast(),
                                input.len(),
                                prval,
                            );
                        }
                    }
                }
            }
        }
        // SAFETY: valid op, ioctx and name; synchronous.
        let rc = unsafe {
            ffi::rados_write_op_operate(write, self.handle, c_oid.as_ptr(), ptr::null_mut(), 0)
        };
        // SAFETY: created above, released once, after it completed.
        unsafe { ffi::rados_release_write_op(write) };
        check(rc, op, target).map(drop)
    }

    /// A new self-managed snapshot ID of this pool, as librbd allocates one for every RBD
    /// snapshot (a monitor operation).
    pub(crate) fn selfmanaged_snap_create(
        &self,
        op: &'static str,
        target: &str,
    ) -> Result<u64, Error> {
        let mut id: ffi::rados_snap_t = 0;
        // SAFETY: valid ioctx; valid out-pointer.
        let rc = unsafe { ffi::rados_ioctx_selfmanaged_snap_create(self.handle, &mut id) };
        check(rc, op, target)?;
        Ok(id)
    }

    /// Releases self-managed snapshot ID `id` of this pool (one no snapshot took).
    pub(crate) fn selfmanaged_snap_remove(
        &self,
        op: &'static str,
        target: &str,
        id: u64,
    ) -> Result<(), Error> {
        // SAFETY: valid ioctx.
        let rc = unsafe { ffi::rados_ioctx_selfmanaged_snap_remove(self.handle, id) };
        check(rc, op, target).map(drop)
    }

    /// Removes object `oid` of this I/O context; `Ok(false)` when it did not exist.
    pub(crate) fn remove_object(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
    ) -> Result<bool, Error> {
        let c_oid = cstring(oid, op, target)?;
        // SAFETY: valid ioctx and object name.
        let rc = unsafe { ffi::rados_remove(self.handle, c_oid.as_ptr()) };
        if rc == -libc::ENOENT {
            return Ok(false);
        }
        check(rc, op, target).map(|_| true)
    }

    /// Removes every object `oids` names, at most `window` at a time (asynchronous removes,
    /// as librbd trims an image); objects that do not exist are skipped. Returns how many
    /// existed. Every removal sent is waited for, also when one fails.
    pub(crate) fn remove_objects(
        &self,
        op: &'static str,
        target: &str,
        oids: impl Iterator<Item = String>,
        window: usize,
    ) -> Result<u64, Error> {
        let mut flight = InFlight {
            pending: std::collections::VecDeque::with_capacity(window.max(1)),
            removed: 0,
            failed: None,
        };
        for oid in oids {
            if flight.pending.len() >= window.max(1) {
                flight.finish_oldest();
            }
            if flight.failed.is_some() {
                break;
            }
            let c_oid = cstring(&oid, op, target)?;
            let mut completion: ffi::rados_completion_t = ptr::null_mut();
            // SAFETY: no callback; `completion` receives a new completion we release below.
            let rc = unsafe {
                ffi::rados_aio_create_completion2(ptr::null_mut(), None, &mut completion)
            };
            check(rc, op, target)?;
            // SAFETY: valid ioctx, name and completion; librados copies the name.
            let rc = unsafe { ffi::rados_aio_remove(self.handle, c_oid.as_ptr(), completion) };
            if rc < 0 {
                // SAFETY: the completion was never handed to an operation.
                unsafe { ffi::rados_aio_release(completion) };
                flight.failed = Some(rc);
                break;
            }
            flight.pending.push_back(completion);
        }
        while !flight.pending.is_empty() {
            flight.finish_oldest();
        }
        match flight.failed.take() {
            Some(rc) => Err(Error::from_errno(rc, op, target)),
            None => Ok(flight.removed),
        }
    }

    /// Sends an empty notification to the watchers of `oid` and returns how many there were
    /// (answered or timed out after `timeout_ms`). An empty payload is the legacy header-update
    /// notification that librbd and the kernel client both acknowledge (they re-read the
    /// header); zero means nobody watches the object.
    pub(crate) fn notify_watchers(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
        timeout_ms: u64,
    ) -> Result<usize, Error> {
        let c_oid = cstring(oid, op, target)?;
        let mut reply: *mut c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: valid ioctx and name; an empty payload; librados allocates `reply`.
        let rc = unsafe {
            ffi::rados_notify2(
                self.handle,
                c_oid.as_ptr(),
                ptr::null(),
                0,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        let mut watchers = None;
        if !reply.is_null() {
            let mut acks: *mut ffi::notify_ack_t = ptr::null_mut();
            let mut timeouts: *mut ffi::notify_timeout_t = ptr::null_mut();
            let (mut n_acks, mut n_timeouts) = (0usize, 0usize);
            // SAFETY: `reply` holds `reply_len` bytes from librados; the decoded arrays are
            // released right after, once.
            let decoded = unsafe {
                ffi::rados_decode_notify_response(
                    reply,
                    reply_len,
                    &mut acks,
                    &mut n_acks,
                    &mut timeouts,
                    &mut n_timeouts,
                )
            };
            if decoded == 0 {
                watchers = Some(n_acks + n_timeouts);
                // SAFETY: the arrays the decode above allocated.
                unsafe { ffi::rados_free_notify_response(acks, n_acks, timeouts) };
            }
            // SAFETY: the reply buffer librados allocated, released once.
            unsafe { ffi::rados_buffer_free(reply) };
        }
        match (rc, watchers) {
            // somebody watches and did not answer in time
            (rc, n) if rc == -libc::ETIMEDOUT => Ok(n.unwrap_or(0).max(1)),
            (rc, _) if rc < 0 => Err(Error::from_errno(rc, op, target)),
            (_, Some(n)) => Ok(n),
            (_, None) => Err(Error::invalid(
                op,
                target,
                "librados returned an undecodable notify reply",
            )),
        }
    }

    /// Watches `oid` until the returned [`Watch`] is dropped, acknowledging every notification
    /// with an empty answer (what a watcher that owns nothing answers). Another client sees this
    /// client as alive by its watch: librbd and the kernel client check a lock's owner that way
    /// before they break the lock.
    pub(crate) fn watch(
        &self,
        op: &'static str,
        target: &str,
        oid: &str,
    ) -> Result<Watch<'_>, Error> {
        let ctx = Box::new(WatchCtx {
            io: self.handle,
            oid: cstring(oid, op, target)?,
        });
        let mut handle = 0u64;
        // SAFETY: valid ioctx and name; `ctx` is boxed (a stable address) and outlives the
        // watch: `Watch::drop` unregisters it and flushes pending callbacks before freeing it.
        let rc = unsafe {
            ffi::rados_watch2(
                self.handle,
                ctx.oid.as_ptr(),
                &mut handle,
                Some(ack_notification),
                Some(watch_lost),
                std::ptr::from_ref::<WatchCtx>(&ctx).cast_mut().cast(),
            )
        };
        check(rc, op, target)?;
        Ok(Watch {
            io: self,
            handle,
            _ctx: ctx,
        })
    }

    pub(crate) fn list_images(&self) -> Result<Vec<String>, Error> {
        let op = "list images";
        let mut max: usize = 64;
        for _ in 0..8 {
            let mut specs: Vec<ffi::rbd_image_spec_t> = Vec::with_capacity(max);
            let mut n = max;
            // SAFETY: `specs` has room for `n` entries; librbd fills at most `n` and sets `n`.
            let rc = unsafe { ffi::rbd_list2(self.handle, specs.as_mut_ptr(), &mut n) };
            if rc == -libc::ERANGE {
                max = n.max(max * 2);
                continue;
            }
            check(rc, op, &self.pool)?;
            // SAFETY: librbd initialised the first `n` entries.
            unsafe { specs.set_len(n) };
            // SAFETY: names are valid C strings until the cleanup call below.
            let names = specs.iter().map(|s| unsafe { owned(s.name) }).collect();
            // SAFETY: releases the strings librbd allocated for exactly these entries.
            unsafe { ffi::rbd_image_spec_list_cleanup(specs.as_mut_ptr(), n) };
            return Ok(names);
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.pool))
    }

    pub(crate) fn trash_move(&self, name: &str, delay_secs: u64) -> Result<(), Error> {
        let op = "move image to trash";
        let target = self.spec(name);
        let c_name = cstring(name, op, &target)?;
        // SAFETY: valid ioctx and name.
        check(
            unsafe { ffi::rbd_trash_move(self.handle, c_name.as_ptr(), delay_secs) },
            op,
            &target,
        )
        .map(drop)
    }

    pub(crate) fn trash_list(&self) -> Result<Vec<TrashEntry>, Error> {
        let op = "list trash";
        let mut max: usize = 32;
        for _ in 0..8 {
            let mut entries: Vec<ffi::rbd_trash_image_info_t> = Vec::with_capacity(max);
            let mut n = max;
            // SAFETY: room for `n` entries.
            let rc = unsafe { ffi::rbd_trash_list(self.handle, entries.as_mut_ptr(), &mut n) };
            if rc == -libc::ERANGE {
                max = n.max(max * 2);
                continue;
            }
            check(rc, op, &self.pool)?;
            // SAFETY: librbd initialised the first `n` entries.
            unsafe { entries.set_len(n) };
            let list = entries
                .iter()
                // SAFETY: valid C strings until the cleanup call.
                .map(|e| TrashEntry {
                    id: unsafe { owned(e.id) },
                    name: unsafe { owned(e.name) },
                    deferment_end: e.deferment_end_time,
                })
                .collect();
            // SAFETY: releases exactly these entries.
            unsafe { ffi::rbd_trash_list_cleanup(entries.as_mut_ptr(), n) };
            return Ok(list);
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.pool))
    }

    pub(crate) fn trash_restore(&self, id: &str, new_name: &str) -> Result<(), Error> {
        let op = "restore image from trash";
        let target = format!("{} (trash id {id})", self.spec(new_name));
        let (c_id, c_name) = (cstring(id, op, &target)?, cstring(new_name, op, &target)?);
        // SAFETY: valid ioctx and strings.
        check(
            unsafe { ffi::rbd_trash_restore(self.handle, c_id.as_ptr(), c_name.as_ptr()) },
            op,
            &target,
        )
        .map(drop)
    }

    pub(crate) fn trash_remove(&self, id: &str, force: bool) -> Result<(), Error> {
        let op = "remove image from trash";
        let target = format!("{}/<trash id {id}>", self.pool);
        let c_id = cstring(id, op, &target)?;
        // SAFETY: valid ioctx and string; progress callback required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_trash_remove_with_progress(
                self.handle,
                c_id.as_ptr(),
                force,
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, op, &target).map(drop)
    }

    pub(crate) fn pool_stats(&self) -> Result<PoolStats, Error> {
        // SAFETY: all-zero is a valid value of this plain C struct of integers.
        let mut st: ffi::rados_pool_stat_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid ioctx and out-struct.
        check(
            unsafe { ffi::rados_ioctx_pool_stat(self.handle, &mut st) },
            "pool stats",
            &self.pool,
        )?;
        Ok(PoolStats {
            used_bytes: st.num_bytes,
            objects: st.num_objects,
        })
    }
}

/// An open image (`rbd_image_t`).
pub(crate) struct Image<'a> {
    handle: ffi::rbd_image_t,
    target: String,
    _io: PhantomData<&'a IoCtx<'a>>,
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        // SAFETY: opened by rbd_open*, closed once, before its ioctx.
        unsafe { ffi::rbd_close(self.handle) };
    }
}

impl Image<'_> {
    pub(crate) fn info(&self) -> Result<ImageInfo, Error> {
        let op = "stat image";
        // SAFETY: all-zero is valid for this plain C struct.
        let mut st: ffi::rbd_image_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image and an out-struct of the size we pass.
        check(
            unsafe {
                ffi::rbd_stat(
                    self.handle,
                    &mut st,
                    std::mem::size_of::<ffi::rbd_image_info_t>(),
                )
            },
            op,
            &self.target,
        )?;
        let mut features = 0u64;
        // SAFETY: open image, valid out-pointer.
        check(
            unsafe { ffi::rbd_get_features(self.handle, &mut features) },
            op,
            &self.target,
        )?;
        // SAFETY (both closures): open image; librbd writes at most `len` bytes and sets `len`.
        let id = with_buffer(
            op,
            &self.target,
            32,
            |b, len| unsafe { ffi::rbd_get_id(self.handle, b, *len) },
            c_text,
        )?;
        let prefix = with_buffer(
            op,
            &self.target,
            64,
            |b, len| unsafe { ffi::rbd_get_block_name_prefix(self.handle, b, *len) },
            c_text,
        )?;
        let mut created = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: open image and a valid out-struct (librbd's `struct timespec` is libc's).
        check(
            unsafe {
                ffi::rbd_get_create_timestamp(self.handle, std::ptr::from_mut(&mut created).cast())
            },
            op,
            &self.target,
        )?;
        Ok(ImageInfo {
            size: st.size,
            object_size: st.obj_size,
            features: Features::from_bits(features),
            id,
            block_name_prefix: prefix,
            created: std::time::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(created.tv_sec).unwrap_or(0),
                    u32::try_from(created.tv_nsec).unwrap_or(0),
                ),
        })
    }

    pub(crate) fn watchers(&self) -> Result<Vec<Watcher>, Error> {
        let op = "list watchers";
        let mut max: usize = 8;
        for _ in 0..8 {
            let mut list: Vec<ffi::rbd_image_watcher_t> = Vec::with_capacity(max);
            let mut n = max;
            // SAFETY: room for `n` entries.
            let rc = unsafe { ffi::rbd_watchers_list(self.handle, list.as_mut_ptr(), &mut n) };
            if rc == -libc::ERANGE {
                max = n.max(max * 2);
                continue;
            }
            check(rc, op, &self.target)?;
            // SAFETY: librbd initialised `n` entries.
            unsafe { list.set_len(n) };
            let watchers = list
                .iter()
                // SAFETY: valid C strings until cleanup.
                .map(|w| Watcher {
                    address: unsafe { owned(w.addr) },
                    id: w.id as u64,
                    cookie: w.cookie,
                })
                .collect();
            // SAFETY: releases exactly these entries.
            unsafe { ffi::rbd_watchers_list_cleanup(list.as_mut_ptr(), n) };
            return Ok(watchers);
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.target))
    }

    /// The holders of the image's `rbd_lock` (librbd's exclusive lock and krbd's: a client that
    /// writes holds it), as `rbd lock ls` lists them.
    pub(crate) fn lockers(&self) -> Result<Vec<Locker>, Error> {
        let op = "list lockers";
        let (mut tag_len, mut clients_len, mut cookies_len, mut addrs_len) =
            (64usize, 256usize, 256usize, 256usize);
        for _ in 0..8 {
            let mut tag = vec![0u8; tag_len];
            let mut clients = vec![0u8; clients_len];
            let mut cookies = vec![0u8; cookies_len];
            let mut addrs = vec![0u8; addrs_len];
            let mut exclusive: c_int = 0;
            // SAFETY: each buffer has room for the length passed with it; librbd writes back
            // the lengths it needs (and -ERANGE) when one is too small.
            let rc = unsafe {
                ffi::rbd_list_lockers(
                    self.handle,
                    &mut exclusive,
                    tag.as_mut_ptr().cast(),
                    &mut tag_len,
                    clients.as_mut_ptr().cast(),
                    &mut clients_len,
                    cookies.as_mut_ptr().cast(),
                    &mut cookies_len,
                    addrs.as_mut_ptr().cast(),
                    &mut addrs_len,
                )
            };
            if rc == -(libc::ERANGE as isize) {
                continue;
            }
            let n = check(
                c_int::try_from(rc).unwrap_or(-libc::EOVERFLOW),
                op,
                &self.target,
            )?;
            clients.truncate(clients_len.min(clients.len()));
            cookies.truncate(cookies_len.min(cookies.len()));
            addrs.truncate(addrs_len.min(addrs.len()));
            let (clients, cookies, addrs) = (
                nul_terminated(&clients),
                nul_terminated(&cookies),
                nul_terminated(&addrs),
            );
            let n = usize::try_from(n).unwrap_or(0);
            return Ok(clients
                .into_iter()
                .zip(cookies)
                .zip(addrs)
                .take(n)
                .map(|((client, cookie), address)| Locker {
                    id: client
                        .strip_prefix("client.")
                        .and_then(|id| id.parse().ok()),
                    client,
                    cookie,
                    address,
                })
                .collect());
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.target))
    }

    /// Breaks `client`'s (`client.<id>`) hold on the image's `rbd_lock` with `cookie`, as `rbd
    /// lock rm` does (librbd blocklists the holder first when `rbd_blocklist_on_break_lock`
    /// is on, its default).
    pub(crate) fn break_lock(&self, client: &str, cookie: &str) -> Result<(), Error> {
        let op = "break lock";
        let c_client = cstring(client, op, &self.target)?;
        let c_cookie = cstring(cookie, op, &self.target)?;
        // SAFETY: open image; NUL-terminated strings that outlive the call.
        let rc = unsafe { ffi::rbd_break_lock(self.handle, c_client.as_ptr(), c_cookie.as_ptr()) };
        check(rc, op, &self.target).map(drop)
    }

    pub(crate) fn resize(&self, size: u64, allow_shrink: bool) -> Result<(), Error> {
        // SAFETY: open image; a progress callback is required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_resize2(
                self.handle,
                size,
                allow_shrink,
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, "resize image", &self.target).map(drop)
    }

    pub(crate) fn metadata_get(&self, key: &str) -> Result<Option<String>, Error> {
        let op = "get image metadata";
        let c_key = cstring(key, op, &self.target)?;
        // SAFETY: open image, key string, buffer of `len` bytes.
        let got = with_buffer(
            op,
            &self.target,
            256,
            |b, len| unsafe { ffi::rbd_metadata_get(self.handle, c_key.as_ptr(), b, len) },
            c_text,
        );
        match got {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn metadata_set(&self, key: &str, value: &str) -> Result<(), Error> {
        let op = "set image metadata";
        let (k, v) = (
            cstring(key, op, &self.target)?,
            cstring(value, op, &self.target)?,
        );
        // SAFETY: open image and strings.
        check(
            unsafe { ffi::rbd_metadata_set(self.handle, k.as_ptr(), v.as_ptr()) },
            op,
            &self.target,
        )
        .map(drop)
    }

    pub(crate) fn metadata_list(&self) -> Result<BTreeMap<String, String>, Error> {
        let op = "list image metadata";
        let mut keys_len: usize = 1024;
        let mut vals_len: usize = 4096;
        for _ in 0..8 {
            let mut keys = vec![0u8; keys_len];
            let mut vals = vec![0u8; vals_len];
            let (mut kl, mut vl) = (keys_len, vals_len);
            // SAFETY: open image; both buffers have the lengths we pass; start "" and max 0 = all.
            let rc = unsafe {
                ffi::rbd_metadata_list(
                    self.handle,
                    c"".as_ptr(),
                    0,
                    keys.as_mut_ptr().cast(),
                    &mut kl,
                    vals.as_mut_ptr().cast(),
                    &mut vl,
                )
            };
            if rc == -libc::ERANGE {
                keys_len = kl.max(keys_len * 2);
                vals_len = vl.max(vals_len * 2);
                continue;
            }
            check(rc, op, &self.target)?;
            return metadata_pairs(&keys[..kl.min(keys.len())], &vals[..vl.min(vals.len())])
                .ok_or_else(|| {
                    Error::invalid(op, &self.target, "librbd returned unpaired metadata")
                });
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.target))
    }

    fn snap_call(
        &self,
        op: &'static str,
        snap: &str,
        f: unsafe extern "C" fn(ffi::rbd_image_t, *const c_char) -> c_int,
    ) -> Result<(), Error> {
        let target = format!("{}@{snap}", self.target);
        let c_snap = cstring(snap, op, &target)?;
        // SAFETY: `f` is one of librbd's (image, snapshot name) calls; open image and string.
        check(unsafe { f(self.handle, c_snap.as_ptr()) }, op, &target).map(drop)
    }

    pub(crate) fn snap_create(&self, snap: &str) -> Result<(), Error> {
        self.snap_call("create snapshot", snap, ffi::rbd_snap_create)
    }

    /// Removes snapshot `snap`, unprotecting it first where it is protected (a v1 clone's
    /// parent snapshot: librbd refuses to unprotect one that still has clones).
    pub(crate) fn snap_remove(&self, snap: &str) -> Result<(), Error> {
        let op = "remove snapshot";
        let target = format!("{}@{snap}", self.target);
        let c_snap = cstring(snap, op, &target)?;
        // SAFETY: open image and string; progress callback required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_snap_remove2(
                self.handle,
                c_snap.as_ptr(),
                ffi::RBD_SNAP_REMOVE_UNPROTECT,
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, op, &target).map(drop)
    }

    /// Whether snapshot `snap` is protected.
    pub(crate) fn snap_is_protected(&self, snap: &str) -> Result<bool, Error> {
        let op = "read snapshot protection";
        let target = format!("{}@{snap}", self.target);
        let c_snap = cstring(snap, op, &target)?;
        let mut protected: c_int = 0;
        // SAFETY: open image, string and out-pointer.
        let rc =
            unsafe { ffi::rbd_snap_is_protected(self.handle, c_snap.as_ptr(), &mut protected) };
        check(rc, op, &target)?;
        Ok(protected != 0)
    }

    pub(crate) fn snap_protect(&self, snap: &str) -> Result<(), Error> {
        self.snap_call("protect snapshot", snap, ffi::rbd_snap_protect)
    }

    pub(crate) fn snap_unprotect(&self, snap: &str) -> Result<(), Error> {
        self.snap_call("unprotect snapshot", snap, ffi::rbd_snap_unprotect)
    }

    /// Every snapshot of the image, of every namespace: `(id, name, size)`.
    fn snap_entries(&self, op: &'static str) -> Result<Vec<(u64, String, u64)>, Error> {
        let mut max: c_int = 16;
        for _ in 0..8 {
            // librbd writes `max` entries plus an end marker
            let mut snaps: Vec<ffi::rbd_snap_info_t> = Vec::with_capacity(max as usize + 1);
            let mut n = max;
            // SAFETY: room for `n + 1` entries.
            let rc = unsafe { ffi::rbd_snap_list(self.handle, snaps.as_mut_ptr(), &mut n) };
            if rc == -libc::ERANGE {
                max = n.max(max * 2);
                continue;
            }
            let count = check(rc, op, &self.target)? as usize;
            // SAFETY: librbd initialised `count` entries (and the end marker).
            unsafe { snaps.set_len(count) };
            let entries = snaps
                .iter()
                // SAFETY: valid C strings until rbd_snap_list_end.
                .map(|s| (s.id, unsafe { owned(s.name) }, s.size))
                .collect();
            // SAFETY: releases the names librbd allocated.
            unsafe { ffi::rbd_snap_list_end(snaps.as_mut_ptr()) };
            return Ok(entries);
        }
        Err(Error::from_errno(-libc::ERANGE, op, &self.target))
    }

    /// The namespace of snapshot `id`; `None` when it was removed meanwhile.
    fn snap_namespace(
        &self,
        id: u64,
        op: &'static str,
    ) -> Result<Option<ffi::rbd_snap_namespace_type_t>, Error> {
        let mut namespace: ffi::rbd_snap_namespace_type_t = 0;
        // SAFETY: open image, a listed snapshot id and an out-pointer.
        let rc = unsafe { ffi::rbd_snap_get_namespace_type(self.handle, id, &mut namespace) };
        if rc == -libc::ENOENT {
            return Ok(None);
        }
        check(rc, op, &self.target)?;
        Ok(Some(namespace))
    }

    /// Every snapshot of the image, of every namespace, oldest first: its ID and, for one in
    /// the snapshot trash (removed while clones v2 depend on it), the name it had.
    pub(crate) fn snap_entries_all(&self) -> Result<Vec<SnapEntry>, Error> {
        let op = "list snapshots";
        let mut list = Vec::new();
        for (id, _, _) in self.snap_entries(op)? {
            let trashed_as = if self.snap_namespace(id, op)?
                == Some(ffi::rbd_snap_namespace_type_t_RBD_SNAP_NAMESPACE_TYPE_TRASH)
            {
                let mut buf = vec![0u8; 4096];
                // SAFETY: open image, a listed snapshot ID; `buf` is valid for its length.
                let rc = unsafe {
                    ffi::rbd_snap_get_trash_namespace(
                        self.handle,
                        id,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if rc == -libc::ENOENT {
                    continue;
                }
                check(rc, op, &self.target)?;
                Some(c_text(&buf))
            } else {
                None
            };
            list.push(SnapEntry { id, trashed_as });
        }
        list.sort_by_key(|e| e.id);
        Ok(list)
    }

    pub(crate) fn snap_list(&self) -> Result<Vec<SnapInfo>, Error> {
        let op = "list snapshots";
        let mut list = Vec::new();
        for (id, name, size) in self.snap_entries(op)? {
            // only user snapshots: not those of a group, nor removed ones that wait in the
            // snapshot trash for their clones (clone v2)
            if self.snap_namespace(id, op)?
                != Some(ffi::rbd_snap_namespace_type_t_RBD_SNAP_NAMESPACE_TYPE_USER)
            {
                continue;
            }
            let mut protected: c_int = 0;
            let c_name = cstring(&name, op, &self.target)?;
            // SAFETY: open image, string and out-pointer.
            let rc =
                unsafe { ffi::rbd_snap_is_protected(self.handle, c_name.as_ptr(), &mut protected) };
            check(rc, op, &self.target)?;
            let mut created = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: open image, a snapshot id librbd just listed, a valid out-struct
            // (librbd's `struct timespec` is libc's).
            let rc = unsafe {
                ffi::rbd_snap_get_timestamp(
                    self.handle,
                    id,
                    std::ptr::from_mut(&mut created).cast(),
                )
            };
            check(rc, op, &self.target)?;
            list.push(SnapInfo {
                id,
                name,
                size,
                protected: protected != 0,
                created: system_time(&created),
            });
        }
        Ok(list)
    }

    /// The snapshot this image was cloned from; `None` for an image that is no clone (or was
    /// flattened).
    pub(crate) fn parent(&self) -> Result<Option<ParentSpec>, Error> {
        let op = "read image parent";
        // SAFETY: plain C structs of integers and pointers: all-zero is a valid value.
        let mut image: ffi::rbd_linked_image_spec_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut snap: ffi::rbd_snap_spec_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image and valid out-structs; on success librbd allocates their strings,
        // released by the cleanup calls below.
        let rc = unsafe { ffi::rbd_get_parent(self.handle, &mut image, &mut snap) };
        if rc == -libc::ENOENT {
            return Ok(None);
        }
        check(rc, op, &self.target)?;
        // SAFETY: strings librbd set (or null), valid until the cleanup calls.
        let parent = unsafe {
            ParentSpec {
                pool: owned(image.pool_name),
                namespace: owned(image.pool_namespace),
                image: owned(image.image_name),
                image_id: owned(image.image_id),
                in_trash: image.trash,
                snap: owned(snap.name),
                snap_id: snap.id,
            }
        };
        // SAFETY: release what rbd_get_parent allocated, once.
        unsafe {
            ffi::rbd_linked_image_spec_cleanup(&mut image);
            ffi::rbd_snap_spec_cleanup(&mut snap);
        }
        Ok(Some(parent))
    }

    /// Deallocates the image's zeroed extents (`rbd sparsify`): every aligned `sparse_size`
    /// bytes that read as zeros become a hole, an object that is all zeros is removed.
    pub(crate) fn sparsify(&self, sparse_size: u64) -> Result<(), Error> {
        let op = "sparsify image";
        let sparse_size = usize::try_from(sparse_size)
            .map_err(|_| Error::invalid(op, self.target.as_str(), "sparse size too large"))?;
        // SAFETY: open image; progress callback required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_sparsify_with_progress(
                self.handle,
                sparse_size,
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, op, &self.target).map(drop)
    }

    /// The bytes the image's head has allocated, as `rbd du` counts them: whole objects
    /// (librbd reads the fast-diff object map when it is enabled and valid, else asks the OSDs
    /// object by object); with `whole_objects` false, as `rbd du --exact` counts them: the
    /// allocated extents of each object (the OSDs asked object by object).
    pub(crate) fn used_bytes(&self, size: u64, whole_objects: bool) -> Result<u64, Error> {
        let op = "read used size";
        let mut used: u64 = 0;
        // SAFETY: open image; `count_used` only adds to the u64 `used` points to, which
        // outlives the call (librbd calls back synchronously, before rbd_diff_iterate2 returns).
        let rc = unsafe {
            ffi::rbd_diff_iterate2(
                self.handle,
                ptr::null(),
                0,
                size,
                0,
                u8::from(whole_objects),
                Some(count_used),
                std::ptr::from_mut(&mut used).cast(),
            )
        };
        check(rc, op, &self.target)?;
        Ok(used)
    }

    pub(crate) fn mirror_enable(&self) -> Result<(), Error> {
        // SAFETY: open image.
        let rc = unsafe {
            ffi::rbd_mirror_image_enable2(
                self.handle,
                ffi::rbd_mirror_image_mode_t_RBD_MIRROR_IMAGE_MODE_SNAPSHOT,
            )
        };
        check(rc, "enable image mirroring", &self.target).map(drop)
    }

    pub(crate) fn mirror_disable(&self, force: bool) -> Result<(), Error> {
        // SAFETY: open image.
        let rc = unsafe { ffi::rbd_mirror_image_disable(self.handle, force) };
        check(rc, "disable image mirroring", &self.target).map(drop)
    }

    pub(crate) fn mirror_promote(&self, force: bool) -> Result<(), Error> {
        // SAFETY: open image.
        let rc = unsafe { ffi::rbd_mirror_image_promote(self.handle, force) };
        check(rc, "promote image", &self.target).map(drop)
    }

    pub(crate) fn mirror_demote(&self) -> Result<(), Error> {
        // SAFETY: open image.
        let rc = unsafe { ffi::rbd_mirror_image_demote(self.handle) };
        check(rc, "demote image", &self.target).map(drop)
    }

    pub(crate) fn mirror_resync(&self) -> Result<(), Error> {
        // SAFETY: open image.
        let rc = unsafe { ffi::rbd_mirror_image_resync(self.handle) };
        check(rc, "resync image", &self.target).map(drop)
    }

    pub(crate) fn mirror_snapshot(&self) -> Result<u64, Error> {
        let mut id: u64 = 0;
        // SAFETY: open image and an out-value.
        let rc = unsafe { ffi::rbd_mirror_image_create_snapshot(self.handle, &mut id) };
        check(rc, "create mirror snapshot", &self.target)?;
        Ok(id)
    }

    fn mirror_snapshot_mode(&self, state: MirrorImageState) -> Result<Option<bool>, Error> {
        if state == MirrorImageState::Disabled {
            return Ok(None);
        }
        let mut mode = ffi::rbd_mirror_image_mode_t_RBD_MIRROR_IMAGE_MODE_JOURNAL;
        // SAFETY: open image and an out-value.
        let rc = unsafe { ffi::rbd_mirror_image_get_mode(self.handle, &mut mode) };
        check(rc, "read image mirroring mode", &self.target)?;
        Ok(Some(
            mode == ffi::rbd_mirror_image_mode_t_RBD_MIRROR_IMAGE_MODE_SNAPSHOT,
        ))
    }

    /// The image's mirror snapshots, oldest first.
    pub(crate) fn mirror_snapshots(&self) -> Result<Vec<MirrorSnapshot>, Error> {
        let op = "list mirror snapshots";
        let mut list = Vec::new();
        for (id, _, _) in self.snap_entries(op)? {
            if self.snap_namespace(id, op)?
                != Some(ffi::rbd_snap_namespace_type_t_RBD_SNAP_NAMESPACE_TYPE_MIRROR)
            {
                continue;
            }
            let size = std::mem::size_of::<ffi::rbd_snap_mirror_namespace_t>();
            // SAFETY: plain C struct of integers, a bool and pointers: all-zero is valid.
            let mut ns: ffi::rbd_snap_mirror_namespace_t = unsafe { std::mem::zeroed() };
            // SAFETY: open image, a listed snapshot id, an out-struct of `size` bytes; librbd
            // allocates its strings, released by the cleanup below.
            let rc = unsafe { ffi::rbd_snap_get_mirror_namespace(self.handle, id, &mut ns, size) };
            if rc == -libc::ENOENT {
                continue;
            }
            check(rc, op, &self.target)?;
            let primary = matches!(
                ns.state,
                ffi::rbd_snap_mirror_state_t_RBD_SNAP_MIRROR_STATE_PRIMARY
                    | ffi::rbd_snap_mirror_state_t_RBD_SNAP_MIRROR_STATE_PRIMARY_DEMOTED
            );
            let demoted = matches!(
                ns.state,
                ffi::rbd_snap_mirror_state_t_RBD_SNAP_MIRROR_STATE_PRIMARY_DEMOTED
                    | ffi::rbd_snap_mirror_state_t_RBD_SNAP_MIRROR_STATE_NON_PRIMARY_DEMOTED
            );
            let complete = ns.complete;
            // SAFETY: releases what librbd allocated in `ns`, once.
            unsafe { ffi::rbd_snap_mirror_namespace_cleanup(&mut ns, size) };
            // SAFETY: plain C struct of integers: all-zero is valid.
            let mut at: ffi::timespec = unsafe { std::mem::zeroed() };
            // SAFETY: open image, a listed snapshot id and an out-struct.
            let rc = unsafe { ffi::rbd_snap_get_timestamp(self.handle, id, &mut at) };
            if rc == -libc::ENOENT {
                continue;
            }
            check(rc, op, &self.target)?;
            list.push(MirrorSnapshot {
                id,
                created: at.tv_sec,
                primary,
                demoted,
                complete,
            });
        }
        Ok(list)
    }

    pub(crate) fn mirror_info(&self) -> Result<MirrorImageInfo, Error> {
        let size = std::mem::size_of::<ffi::rbd_mirror_image_info_t>();
        // SAFETY: plain C struct of a pointer, an enum and a bool: all-zero is valid.
        let mut info: ffi::rbd_mirror_image_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image and an out-struct of `size` bytes; librbd allocates its string,
        // released by `owned_mirror_info`.
        let rc = unsafe { ffi::rbd_mirror_image_get_info(self.handle, &mut info, size) };
        check(rc, "read image mirroring", &self.target)?;
        // SAFETY: the string librbd set, released right after.
        let mut read = unsafe { mirror_info_of(&info) };
        // SAFETY: releases what librbd allocated in `info`, once.
        unsafe { ffi::rbd_mirror_image_get_info_cleanup(&mut info) };
        read.snapshot_mode = self.mirror_snapshot_mode(read.state)?;
        Ok(read)
    }

    pub(crate) fn mirror_global_status(&self) -> Result<MirrorGlobalStatus, Error> {
        let size = std::mem::size_of::<ffi::rbd_mirror_image_global_status_t>();
        // SAFETY: plain C struct of pointers, integers and a bool: all-zero is valid.
        let mut status: ffi::rbd_mirror_image_global_status_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image and an out-struct of `size` bytes; librbd allocates its strings
        // and site array, released by the cleanup below.
        let rc = unsafe { ffi::rbd_mirror_image_get_global_status(self.handle, &mut status, size) };
        check(rc, "read image mirroring status", &self.target)?;
        let count = usize::try_from(status.site_statuses_count).unwrap_or(0);
        let mut sites = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `site_statuses` holds `site_statuses_count` entries librbd set.
            let site = unsafe { &*status.site_statuses.add(i) };
            let state = match site.state {
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_ERROR => {
                    MirrorStatusState::Error
                }
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_SYNCING => {
                    MirrorStatusState::Syncing
                }
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_STARTING_REPLAY => {
                    MirrorStatusState::StartingReplay
                }
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_REPLAYING => {
                    MirrorStatusState::Replaying
                }
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_STOPPING_REPLAY => {
                    MirrorStatusState::StoppingReplay
                }
                ffi::rbd_mirror_image_status_state_t_MIRROR_IMAGE_STATUS_STATE_STOPPED => {
                    MirrorStatusState::Stopped
                }
                _ => MirrorStatusState::Unknown,
            };
            sites.push(MirrorSiteStatus {
                // SAFETY: strings librbd set, valid until the cleanup.
                mirror_uuid: unsafe { owned(site.mirror_uuid) },
                state,
                // SAFETY: as above.
                description: unsafe { owned(site.description) },
                last_update: site.last_update,
                up: site.up,
            });
        }
        // SAFETY: the info part's strings, read before the cleanup releases them.
        let mut info = unsafe { mirror_info_of(&status.info) };
        // SAFETY: releases what librbd allocated in `status` (its info included), once.
        unsafe { ffi::rbd_mirror_image_global_status_cleanup(&mut status) };
        info.snapshot_mode = self.mirror_snapshot_mode(info.state)?;
        Ok(MirrorGlobalStatus { info, sites })
    }

    pub(crate) fn flatten(&self) -> Result<(), Error> {
        // SAFETY: open image; progress callback required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_flatten_with_progress(self.handle, Some(no_progress), ptr::null_mut())
        };
        check(rc, "flatten image", &self.target).map(drop)
    }

    /// Rebuilds the object map from the objects that exist (librbd's `rbd object-map
    /// rebuild`), clearing its invalid flags.
    pub(crate) fn rebuild_object_map(&self) -> Result<(), Error> {
        // SAFETY: open image; progress callback required by the C wrapper.
        let rc =
            unsafe { ffi::rbd_rebuild_object_map(self.handle, Some(no_progress), ptr::null_mut()) };
        check(rc, "rebuild object map", &self.target).map(drop)
    }

    /// The snapshots this image carries for group snapshots (group namespace), which
    /// [`Image::snap_list`] leaves out.
    pub(crate) fn group_snaps(&self) -> Result<Vec<ImageGroupSnap>, Error> {
        let op = "list group snapshots of image";
        let mut list = Vec::new();
        for (id, _, _) in self.snap_entries(op)? {
            if self.snap_namespace(id, op)?
                != Some(ffi::rbd_snap_namespace_type_t_RBD_SNAP_NAMESPACE_TYPE_GROUP)
            {
                continue;
            }
            let size = std::mem::size_of::<ffi::rbd_snap_group_namespace_t>();
            // SAFETY: plain C struct of an integer and pointers: all-zero is valid.
            let mut ns: ffi::rbd_snap_group_namespace_t = unsafe { std::mem::zeroed() };
            // SAFETY: open image, a listed snapshot id, an out-struct of `size` bytes; on
            // success librbd allocates its strings, released by the cleanup below.
            let rc = unsafe { ffi::rbd_snap_get_group_namespace(self.handle, id, &mut ns, size) };
            if rc == -libc::ENOENT {
                continue;
            }
            check(rc, op, &self.target)?;
            // SAFETY: strings librbd set, valid until the cleanup.
            let (group, group_snap) = unsafe { (owned(ns.group_name), owned(ns.group_snap_name)) };
            let group_pool = ns.group_pool;
            // SAFETY: releases what rbd_snap_get_group_namespace allocated, once.
            unsafe { ffi::rbd_snap_group_namespace_cleanup(&mut ns, size) };
            list.push(ImageGroupSnap {
                id,
                group_pool,
                group,
                group_snap,
            });
        }
        Ok(list)
    }

    /// The group this image belongs to: `(pool id, group name)`, `None` when it is in none.
    pub(crate) fn group(&self) -> Result<Option<(i64, String)>, Error> {
        let size = std::mem::size_of::<ffi::rbd_group_info_t>();
        // SAFETY: plain C struct of a pointer and an integer: all-zero is valid.
        let mut info: ffi::rbd_group_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image and an out-struct of `size` bytes; librbd allocates its name,
        // released by the cleanup below.
        let rc = unsafe { ffi::rbd_get_group(self.handle, &mut info, size) };
        check(rc, "read image group", &self.target)?;
        // SAFETY: the name librbd set (empty when in no group), valid until the cleanup.
        let name = unsafe { owned(info.name) };
        let pool = info.pool;
        // SAFETY: releases what rbd_get_group allocated, once.
        unsafe { ffi::rbd_group_info_cleanup(&mut info, size) };
        Ok((pool >= 0 && !name.is_empty()).then_some((pool, name)))
    }

    /// Copies this image as it was at snapshot `snap_id` (any namespace, a group snapshot's
    /// included) to `dest/dest_name`: a full, flattened copy (no parent, no snapshots of the
    /// source are needed afterwards).
    pub(crate) fn deep_copy_at(
        &self,
        snap_id: u64,
        dest: &IoCtx<'_>,
        dest_name: &str,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        let op = "deep copy image";
        let target = format!("{}@{snap_id} -> {}", self.target, dest.spec(dest_name));
        let d = cstring(dest_name, op, &target)?;
        // SAFETY: open image and a snapshot id of it.
        check(
            unsafe { ffi::rbd_snap_set_by_id(self.handle, snap_id) },
            op,
            &target,
        )?;
        let options = ImageOptions::new(opts, op, &target)?;
        options.set_u64(ffi::RBD_IMAGE_OPTION_FLATTEN, 1, op, &target)?;
        // SAFETY: open image, valid destination ioctx, string and options; progress callback
        // required by the C wrapper.
        let rc = unsafe {
            ffi::rbd_deep_copy_with_progress(
                self.handle,
                dest.handle,
                d.as_ptr(),
                options.0,
                Some(no_progress),
                ptr::null_mut(),
            )
        };
        check(rc, op, &target).map(drop)
    }
}

/// The `--name=value` and `--name value` pairs of a CEPH_ARGS value (`--name` alone: `true`);
/// words that are no option are skipped.
fn ceph_args(args: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut words = args.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let Some(option) = word.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, value.to_owned()),
            None => match words.next_if(|next| !next.starts_with("--")) {
                Some(value) => (option, value.to_owned()),
                None => (option, "true".to_owned()),
            },
        };
        pairs.push((name.replace('-', "_"), value));
    }
    pairs
}

/// What a watch's callbacks need: the ioctx and the object's name, to acknowledge.
struct WatchCtx {
    io: ffi::rados_ioctx_t,
    oid: CString,
}

/// A watch on one object ([`IoCtx::watch`]); unregistered when dropped.
pub(crate) struct Watch<'a> {
    io: &'a IoCtx<'a>,
    handle: u64,
    /// The callbacks' argument, kept alive until the watch is unregistered.
    _ctx: Box<WatchCtx>,
}

impl Watch<'_> {
    /// The watch's handle (its cookie, as `rados listwatchers` shows it).
    pub(crate) fn handle(&self) -> u64 {
        self.handle
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        // SAFETY: the watch registered in `IoCtx::watch`, unregistered once; then every
        // callback already queued runs before `ctx` (their argument) is freed.
        unsafe {
            let rc = ffi::rados_unwatch2(self.io.handle, self.handle);
            if rc < 0 {
                tracing::warn!(handle = self.handle, rc, "unregistering a watch failed");
            }
            ffi::rados_watch_flush(ffi::rados_ioctx_get_cluster(self.io.handle));
        }
    }
}

/// A notification to a [`Watch`]: acknowledged at once, with nothing to say.
unsafe extern "C" fn ack_notification(
    arg: *mut c_void,
    notify_id: u64,
    handle: u64,
    _notifier_id: u64,
    _data: *mut c_void,
    _data_len: usize,
) {
    // SAFETY: `arg` is the `WatchCtx` of a registered watch, alive until the watch is
    // unregistered and its callbacks flushed.
    unsafe {
        let ctx = &*arg.cast::<WatchCtx>();
        ffi::rados_notify_ack(ctx.io, ctx.oid.as_ptr(), notify_id, handle, ptr::null(), 0);
    }
}

/// A watch lost (a reconnection, a timeout): nothing to do; the lock it vouched for may be
/// broken, which the holder's next write asserting the lock finds.
unsafe extern "C" fn watch_lost(_arg: *mut c_void, handle: u64, err: c_int) {
    tracing::warn!(handle, err, "a watch was lost");
}

/// One step of [`IoCtx::write_op`].
pub(crate) enum WriteStep<'a> {
    /// Create the object; fail with "exists" if it does.
    CreateExclusive,
    /// Fail with "not found" unless the object exists.
    AssertExists,
    /// Fail with `ECANCELED` unless the object's omap key `key` holds exactly `value`; the OSD
    /// compares a missing key as the empty value, so an empty `value` asserts "absent or empty".
    OmapEquals { key: &'a str, value: &'a [u8] },
    /// Call an object-class method.
    Exec {
        class: &'a str,
        method: &'a str,
        input: &'a [u8],
    },
}

impl<'a> WriteStep<'a> {
    /// A call of the `rbd` object class's `method`.
    pub(crate) fn rbd(method: &'a str, input: &'a [u8]) -> Self {
        WriteStep::Exec {
            class: "rbd",
            method,
            input,
        }
    }

    /// A call of the `lock` object class's `method` (inputs: [`crate::cls_lock`]).
    pub(crate) fn lock(method: &'a str, input: &'a [u8]) -> Self {
        WriteStep::Exec {
            class: "lock",
            method,
            input,
        }
    }
}

/// Asynchronous removals under way: each completion is waited for and released exactly once,
/// also when the caller stops early (`Drop`).
struct InFlight {
    pending: std::collections::VecDeque<ffi::rados_completion_t>,
    removed: u64,
    /// The first error other than "no such object".
    failed: Option<c_int>,
}

impl InFlight {
    fn finish_oldest(&mut self) {
        let Some(completion) = self.pending.pop_front() else {
            return;
        };
        // SAFETY: a completion handed to rados_aio_remove and not released yet.
        let rc = unsafe {
            ffi::rados_aio_wait_for_complete(completion);
            let rc = ffi::rados_aio_get_return_value(completion);
            ffi::rados_aio_release(completion);
            rc
        };
        if rc >= 0 {
            self.removed += 1;
        } else if rc != -libc::ENOENT && self.failed.is_none() {
            self.failed = Some(rc);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        while !self.pending.is_empty() {
            self.finish_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceph_args_are_name_value_pairs() {
        assert_eq!(
            ceph_args(" --log_file=/tmp/x.log --debug-rbd 20 stray --log_to_stderr --a=b=c"),
            [
                ("log_file".to_owned(), "/tmp/x.log".to_owned()),
                ("debug_rbd".to_owned(), "20".to_owned()),
                ("log_to_stderr".to_owned(), "true".to_owned()),
                ("a".to_owned(), "b=c".to_owned()),
            ]
        );
        assert!(ceph_args("").is_empty());
    }

    #[test]
    fn metadata_pairs_keep_empty_values_in_place() {
        let keys = b"a\0b\0c\0";
        let vals = b"1\0\0three\0";
        let pairs = metadata_pairs(keys, vals).unwrap();
        assert_eq!(pairs["a"], "1");
        assert_eq!(pairs["b"], "");
        assert_eq!(pairs["c"], "three");
        assert_eq!(metadata_pairs(b"", b""), Some(BTreeMap::new()));
        assert_eq!(metadata_pairs(b"a\0b\0", b"1\0"), None);
    }
}
