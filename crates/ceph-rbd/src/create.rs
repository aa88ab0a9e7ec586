//! Creating a plain format-2 image with RADOS calls, without librbd.
//!
//! `rbd_create4` copies the client's whole Ceph configuration to apply the pool's overrides to
//! it, a few milliseconds of CPU per image. A plain image (format 2; features among layering,
//! exclusive-lock, object-map, fast-diff, deep-flatten; no data pool, no striping) in a pool
//! librbd has validated, without mirroring and without `rbd_default_*` overrides, is the
//! objects librbd's `image::CreateRequest` writes, in its order:
//!
//! 1. the `rbd_directory` entry (name <-> ID), which fails if the name is taken;
//! 2. the ID object `rbd_id.<name>`;
//! 3. the header `rbd_header.<id>` (the `rbd` class's `create` sets size, order, features,
//!    object prefix and timestamps);
//! 4. the object map `rbd_object_map.<id>` (object-map feature), every object nonexistent.
//!
//! A failed step undoes the earlier ones, as librbd does; a crash between steps leaves a
//! partial image (no header) that librbd's remove cleans up. The ID object is created holding
//! the exclusive `rados` lock [`CREATOR_LOCK`] for [`creator_lock_secs`]: while it holds it, the
//! creator owns the name, and another client does not take its partial image for a crashed one
//! (`Cluster::claim_partial_image`). Anything else is left to librbd
//! ([`Plain::No`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::CreateOptions;
use crate::denc::{Reader, malformed, put_bytes};
use crate::error::Error;
use crate::features::Features;
use crate::header::{NOSNAP, object_map_name};
use crate::raw::{IoCtx, WriteStep};

static CREATED_PLAIN: AtomicU64 = AtomicU64::new(0);

/// The `rados` lock (object class `lock`) on `rbd_id.<name>` that says who is creating the
/// image: the client that holds it (with cookie [`CREATOR_COOKIE`]) owns the name.
pub const CREATOR_LOCK: &str = "rbd-provisioner.create";
const CREATOR_COOKIE: &str = "create";
/// How long the creator lock holds, for a connection whose calls give up after `op_timeout`:
/// twice that plus 5 s (at least 10 s, at most 2 min). Longer than a live create takes (a few
/// RADOS writes in one call bounded by the operation timeout), short enough that the partial
/// image of a creator that died (a SIGKILLed leader) is repaired soon after: 15 s with the
/// provisioner's default 5 s timeout. The lock stays on a finished image until it expires;
/// nothing else reads it.
#[must_use]
pub fn creator_lock_secs(op_timeout: std::time::Duration) -> u32 {
    let secs = op_timeout.as_secs().saturating_mul(2).saturating_add(5);
    u32::try_from(secs.clamp(10, 120)).unwrap_or(120)
}

/// Input of the `lock` class's `lock` method (`cls_lock_lock_op`): the exclusive
/// [`CREATOR_LOCK`] with our cookie, for `secs` ([`creator_lock_secs`]), not renewed.
pub(crate) fn creator_lock_op(secs: u32) -> Vec<u8> {
    crate::cls_lock::lock(
        CREATOR_LOCK,
        CREATOR_COOKIE,
        "",
        "rbd-provisioner image create",
        secs,
    )
}

/// How many images this process created without librbd (see the `create` module).
pub fn created_without_librbd() -> u64 {
    CREATED_PLAIN.load(Ordering::Relaxed)
}

/// Feature bits of a plain image (see `remove::PLAIN_FEATURES`).
const PLAIN_FEATURES: u64 = 1 | 4 | 8 | 16 | 32;
const OBJECT_MAP: u64 = 8;
/// What librbd writes into `rbd_info` once it has validated a pool for RBD.
const VALIDATED: &[u8] = b"overwrite validated";
/// Pool-level configuration keys (`rbd config pool set`) that change how librbd creates an
/// image; with any of them set, librbd creates it.
const DEFAULTS_PREFIX: &str = "conf_rbd_default_";

/// What [`create_plain`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plain {
    /// The image exists now, with this ID.
    Created(String),
    /// Nothing was written: librbd has to create this image.
    No(&'static str),
}

/// The object order (log2 of the object size) of a plain image with these options, or why it
/// is not plain. `default_order` is the client's `rbd_default_order`.
fn plain_order(opts: &CreateOptions, default_order: u8) -> Result<(u8, u64), &'static str> {
    if !matches!(opts.format, None | Some(2)) {
        return Err("format 1");
    }
    let Some(features) = opts.features else {
        return Err("the features are librbd's defaults");
    };
    if features.bits() & !PLAIN_FEATURES != 0 {
        return Err("features beyond the plain ones");
    }
    // librbd's create gives object-map its fast-diff, asked for or not
    let features = if features.contains(Features::OBJECT_MAP) {
        features | Features::FAST_DIFF
    } else {
        features
    };
    if opts.data_pool.is_some() {
        return Err("a data pool");
    }
    let order = match opts.object_size {
        None => default_order,
        Some(size) if size.is_power_of_two() => {
            u8::try_from(size.trailing_zeros()).map_err(|_| "an odd object size")?
        }
        Some(_) => return Err("an object size that is not a power of two"),
    };
    if !(12..=25).contains(&order) {
        return Err("an object size out of range");
    }
    let object_size = 1u64 << order;
    if opts.stripe_unit.is_some_and(|unit| unit != object_size)
        || opts.stripe_count.is_some_and(|count| count != 1)
    {
        return Err("striping");
    }
    Ok((order, features.bits()))
}

/// librbd's `RBD_MAX_IMAGE_ID_LENGTH`: `rbd_data.` and an ID this long fill the 24 bytes (with
/// the NUL) of `rbd_image_info_t::block_name_prefix`.
const MAX_IMAGE_ID_LEN: usize = 14;

/// The image ID librbd's `util::generate_image_id` makes of a client instance ID and 32 random
/// bits: both in hex, unpadded, and of that only the last [`MAX_IMAGE_ID_LEN`] characters
/// (a long-lived cluster's instance IDs reach 2^24 and more).
fn image_id(instance_id: u64, random: u32) -> String {
    let id = format!("{instance_id:x}{random:x}");
    id[id.len().saturating_sub(MAX_IMAGE_ID_LEN)..].to_owned()
}

/// A new image ID as librbd makes them ([`image_id`]).
fn new_id(io: &IoCtx<'_>) -> String {
    let mut random = [0u8; 4];
    // SAFETY: `random` is valid for 4 bytes. A short or failed read leaves zeros, which the
    // exclusive creates below would turn into a retryable "exists", never a shared ID.
    unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    image_id(io.instance_id(), u32::from_le_bytes(random))
}

/// Whether the client or the pool changes librbd's defaults for a new image, or the pool is
/// not validated or mirrored: then librbd creates it.
fn pool_is_plain(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
) -> Result<Option<&'static str>, Error> {
    for key in [
        "rbd_default_data_pool",
        "rbd_default_stripe_unit",
        "rbd_default_stripe_count",
    ] {
        let value = io.conf_get(op, key)?;
        if !(value.is_empty() || value == "0") {
            return Ok(Some("the client sets rbd_default_* options"));
        }
    }
    let pool = io.default_namespace()?;
    match pool.read(op, target, "rbd_info", VALIDATED.len() + 1) {
        Ok(info) if info == VALIDATED => {}
        Ok(_) => return Ok(Some("the pool is not validated for RBD yet")),
        Err(e) if e.is_not_found() => return Ok(Some("the pool is not validated for RBD yet")),
        Err(e) => return Err(e),
    }
    let mut request = Vec::new();
    put_bytes(&mut request, b"conf_rbd_default");
    request.extend_from_slice(&64u64.to_le_bytes());
    let overrides = pool.exec(op, target, "rbd_info", "rbd", "metadata_list", &request)?;
    let overrides = Reader(&overrides)
        .map()
        .ok_or_else(|| malformed(op, target, "metadata_list"))?;
    if overrides.keys().any(|k| k.starts_with(DEFAULTS_PREFIX)) {
        return Ok(Some("the pool overrides rbd_default_* options"));
    }
    match io.exec(op, target, "rbd_mirroring", "rbd", "mirror_mode_get", &[]) {
        Ok(mode) => match Reader(&mode).u32() {
            Some(0) => {}
            Some(_) => return Ok(Some("the pool is mirrored")),
            None => return Err(malformed(op, target, "mirror_mode_get")),
        },
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(None)
}

/// Creates image `name` of `size` bytes without librbd if it is plain
/// (see the module); otherwise writes nothing and says why. "Already exists" when the name is
/// taken (also by a partial image).
pub(crate) fn create_plain(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
    size: u64,
    opts: &CreateOptions,
    lock_secs: u32,
) -> Result<Plain, Error> {
    if crate::librbd_only::librbd_only() {
        return Ok(Plain::No(crate::librbd_only::WHY));
    }
    if let Some(why) = io.compat().refuses(crate::compat::FastPath::Create) {
        return Ok(Plain::No(why));
    }
    let default_order = io
        .conf_get(op, "rbd_default_order")?
        .parse::<u8>()
        .unwrap_or(22);
    let (order, features) = match plain_order(opts, default_order) {
        Ok(plain) => plain,
        Err(why) => return Ok(Plain::No(why)),
    };
    if let Some(why) = pool_is_plain(io, op, target)? {
        return Ok(Plain::No(why));
    }
    let id = new_id(io);
    let (id_object, header) = (format!("rbd_id.{name}"), format!("rbd_header.{id}"));

    let mut entry = Vec::new();
    put_bytes(&mut entry, name.as_bytes());
    put_bytes(&mut entry, id.as_bytes());
    // The namespace's directory exists once the pool (or namespace) is set up for RBD; if it
    // does not, librbd creates the image (and says when the namespace does not exist).
    match io.write_op(
        op,
        target,
        "rbd_directory",
        &[
            WriteStep::AssertExists,
            WriteStep::rbd("dir_add_image", &entry),
        ],
    ) {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Ok(Plain::No("the pool has no image directory")),
        Err(e) => return Err(e),
    }
    let undo_entry = || {
        let _ = io.write_op(
            op,
            target,
            "rbd_directory",
            &[WriteStep::rbd("dir_remove_image", &entry)],
        );
    };
    let mut id_arg = Vec::new();
    put_bytes(&mut id_arg, id.as_bytes());
    let lock = creator_lock_op(lock_secs);
    if let Err(e) = io.write_op(
        op,
        target,
        &id_object,
        &[
            WriteStep::CreateExclusive,
            WriteStep::rbd("set_id", &id_arg),
            WriteStep::lock("lock", &lock),
        ],
    ) {
        undo_entry();
        return Err(e);
    }
    let undo_id = || {
        let _ = io.remove_object(op, target, &id_object);
        undo_entry();
    };

    let mut create = Vec::new();
    create.extend_from_slice(&size.to_le_bytes());
    create.push(order);
    create.extend_from_slice(&features.to_le_bytes());
    put_bytes(&mut create, format!("rbd_data.{id}").as_bytes());
    create.extend_from_slice(&(-1i64).to_le_bytes());
    let steps = [WriteStep::rbd("create", &create)];
    if let Err(e) = io.write_op(op, target, &header, &steps) {
        undo_id();
        return Err(e);
    }
    crate::steps::hit(crate::steps::CREATE_AFTER_HEADER, target);
    if features & OBJECT_MAP != 0 {
        let mut resize = size.div_ceil(1u64 << order).to_le_bytes().to_vec();
        resize.push(0); // OBJECT_NONEXISTENT
        if let Err(e) = io.write_op(
            op,
            target,
            &object_map_name(&id, NOSNAP),
            &[WriteStep::rbd("object_map_resize", &resize)],
        ) {
            let _ = io.remove_object(op, target, &header);
            undo_id();
            return Err(e);
        }
    }
    CREATED_PLAIN.fetch_add(1, Ordering::Relaxed);
    Ok(Plain::Created(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_creator_lock_outlasts_a_live_create_and_not_much_more() {
        use std::time::Duration;
        assert_eq!(creator_lock_secs(Duration::from_secs(5)), 15);
        assert_eq!(creator_lock_secs(Duration::from_secs(30)), 65);
        assert_eq!(creator_lock_secs(Duration::from_millis(500)), 10);
        assert_eq!(creator_lock_secs(Duration::from_secs(3600)), 120);
    }
    use crate::Features;

    fn with(features: &str) -> CreateOptions {
        CreateOptions {
            features: Some(Features::parse(features).unwrap()),
            ..Default::default()
        }
    }

    #[test]
    fn image_ids_are_formed_and_cut_as_librbd_does() {
        // small instance IDs: both parts whole, the random part unpadded
        assert_eq!(image_id(0x1234, 0xdead_beef), "1234deadbeef");
        assert_eq!(image_id(0x1234, 0xbeef), "1234beef");
        assert_eq!(image_id(0, 0), "00");
        // 14 characters fit
        assert_eq!(image_id(0x12_3456, 0xdead_beef), "123456deadbeef");
        // an instance ID of 2^24 and more: only the last 14 characters
        assert_eq!(image_id(0x100_0000, 0xdead_beef), "000000deadbeef");
        assert_eq!(image_id(0x1234_5678, 0x0bad_cafe), "2345678badcafe");
        assert_eq!(image_id(u64::MAX, u32::MAX), "ffffffffffffff");
        for instance in [1u64 << 24, 1 << 32, 1 << 48, u64::MAX] {
            for random in [0u32, 1, 0xffff_ffff] {
                let id = image_id(instance, random);
                assert!(id.len() <= MAX_IMAGE_ID_LEN, "{id}");
                assert!(format!("{instance:x}{random:x}").ends_with(&id));
                // `rbd_data.<id>` and its NUL fit block_name_prefix (24 bytes)
                assert!(format!("rbd_data.{id}").len() < 24);
            }
        }
    }

    #[test]
    fn plain_options_give_the_order_and_features() {
        assert_eq!(plain_order(&with("layering"), 22), Ok((22, 1)));
        let full = with("layering,exclusive-lock,object-map,fast-diff,deep-flatten");
        assert_eq!(plain_order(&full, 22), Ok((22, 61)));
        // object-map comes with fast-diff, as librbd creates it
        assert_eq!(
            plain_order(&with("layering,exclusive-lock,object-map"), 22),
            Ok((22, 29))
        );
        let small = CreateOptions {
            object_size: Some(1 << 20),
            stripe_unit: Some(1 << 20),
            stripe_count: Some(1),
            ..with("layering")
        };
        assert_eq!(plain_order(&small, 22), Ok((20, 1)));
        assert_eq!(plain_order(&with("layering"), 23), Ok((23, 1)));
    }

    #[test]
    fn anything_else_is_left_to_librbd() {
        assert!(
            plain_order(&CreateOptions::default(), 22).is_err(),
            "default features"
        );
        assert!(plain_order(&with("layering,exclusive-lock,journaling"), 22).is_err());
        let cases = [
            CreateOptions {
                format: Some(1),
                ..with("layering")
            },
            CreateOptions {
                data_pool: Some("ec".into()),
                ..with("layering")
            },
            CreateOptions {
                stripe_unit: Some(64 << 10),
                stripe_count: Some(4),
                ..with("layering")
            },
            CreateOptions {
                object_size: Some(3 << 20),
                ..with("layering")
            },
            CreateOptions {
                object_size: Some(64 << 20),
                ..with("layering")
            },
        ];
        for opts in cases {
            assert!(plain_order(&opts, 22).is_err(), "{opts:?}");
        }
    }
}
