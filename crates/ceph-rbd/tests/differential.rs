//! The RADOS-level paths against librbd: each operation they make (a create with every feature
//! set the provisioner uses, a clone, a source's temporary snapshot and a new image's first
//! snapshot, a removal) is made twice on the same cluster, once through librbd
//! (`ceph_rbd::set_librbd_only`) and once without it, on images alike in all but their names
//! (`d-lib-...` and `d-rad-...`, of equal length). What librbd and the OSDs then see must be
//! the same: `rbd info` (features, op_features, flags, order, object size, stripe, parent and
//! overlap), `rbd snap ls --all` (namespaces, trashed snapshots' original names, sizes,
//! protection), `rbd object-map check` of the image and each snapshot, `rbd diff`,
//! `rbd children --all`, the trash, the image's RADOS objects, and the header object's omap:
//! the same keys, equal values where they hold no ID or time; the `parent` and children
//! records decoded with their IDs named by role; snapshot records equal but for their ID,
//! their time and a trashed snapshot's random name; times and sequences of equal length.
//!
//! One test, run step by step: the switch is process-wide. The counters of the RADOS-level
//! paths prove that each "rad" operation took them.

mod common;

use std::collections::BTreeMap;

use ceph_rbd::{CloneJob, CloneRecord, CreateOptions, Features};
use common::*;
use serde_json::Value;

/// Keys whose values are times or the pool's snapshot sequence: compared by length only.
fn compared_by_length(key: &str) -> bool {
    matches!(
        key,
        "snap_seq" | "create_timestamp" | "access_timestamp" | "modify_timestamp"
    )
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// A little-endian reader over an omap value.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        assert!(self.0.len() >= n, "value cut short");
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u32() as usize;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
}

/// `cls_rbd_parent` (`parent` key): version, pool, namespace, image ID (named by its role),
/// snapshot ID (left out), overlap.
fn decode_parent(value: &[u8], ids: &BTreeMap<String, String>) -> Value {
    let mut r = Reader(value);
    let (version, compat, _len) = (r.u8(), r.u8(), r.u32());
    let pool = r.u64();
    let namespace = if version >= 2 {
        r.string()
    } else {
        String::new()
    };
    let image = r.string();
    let _snap = r.u64();
    let overlap = if version >= 2 {
        (r.u8() == 1).then(|| r.u64())
    } else {
        Some(r.u64())
    };
    serde_json::json!({
        "version": version, "compat": compat, "pool": pool, "namespace": namespace,
        "image": ids.get(&image).cloned().unwrap_or(image), "overlap": overlap,
        "rest": r.0.len(),
    })
}

/// A set of `ChildImageSpec`s (`snap_children_*` keys): each child's version, pool and
/// namespace, its ID named by its role.
fn decode_children(value: &[u8], ids: &BTreeMap<String, String>) -> Value {
    let mut r = Reader(value);
    let count = r.u32();
    let children: Vec<Value> = (0..count)
        .map(|_| {
            let (version, compat, _len) = (r.u8(), r.u8(), r.u32());
            let pool = r.u64();
            let image = r.string();
            let namespace = if version >= 2 {
                r.string()
            } else {
                String::new()
            };
            serde_json::json!({
                "version": version, "compat": compat, "pool": pool, "namespace": namespace,
                "image": ids.get(&image).cloned().unwrap_or(image),
            })
        })
        .collect();
    serde_json::json!({ "children": children, "rest": r.0.len() })
}

/// A `cls_rbd_snap` (`snapshot_*` keys) with its ID (bytes 6 to 14) masked, the side's name
/// made neutral and a trashed snapshot's UUID name masked; its time (8 bytes further on) is told apart in [`alike_snapshots`].
fn masked_snapshot(hex: &str) -> Vec<u8> {
    let neutral = hex
        .replace(&hex_of("d-lib-"), &hex_of("d-X!!-"))
        .replace(&hex_of("d-rad-"), &hex_of("d-X!!-"));
    let mut bytes = unhex(&neutral);
    bytes[6..14].fill(0);
    // the name: a trashed snapshot's is a random UUID
    let name_len = u32::from_le_bytes(bytes[14..18].try_into().unwrap()) as usize;
    if is_uuid(&String::from_utf8_lossy(&bytes[18..18 + name_len])) {
        bytes[18..18 + name_len].fill(0);
    }
    bytes
}

fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Two snapshot records alike: equal length, equal bytes but for one stretch of at most 8
/// (the snapshot's time).
fn alike_snapshots(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let differing: Vec<usize> = (0..a.len()).filter(|i| a[*i] != b[*i]).collect();
    match (differing.first(), differing.last()) {
        (Some(first), Some(last)) => last - first < 8,
        _ => true,
    }
}

/// The omap of each object, `{object: {key: hex value}}`, read with python-rados.
fn omaps(objects: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let ceph = micro_ceph::cluster();
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys, json, rados
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
out = {}
for name in sys.argv[3:]:
    with rados.ReadOpCtx() as op:
        it, _ = io.get_omap_vals(op, '', '', 10000)
        io.operate_read_op(op, name)
        out[name] = {k: v.hex() for k, v in it}
print(json.dumps(out))
io.close(); c.shutdown()
",
        ])
        .arg(&ceph.conf_path)
        .arg(&ceph.pool)
        .args(objects)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python-rados: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One image's header omap made comparable: `snapshot_<id>` and `snap_children_<id>` keys
/// numbered by their order; IDs named by their role (`ids`: ID -> role), the `parent` and
/// children records decoded; times and sequences by their length; snapshot records masked
/// (compared with [`alike_snapshots`] by the caller: kept as hex here).
fn comparable_omap(
    omap: &BTreeMap<String, String>,
    own_id: &str,
    ids: &BTreeMap<String, String>,
) -> BTreeMap<String, Value> {
    let mut numbered = BTreeMap::new();
    let (mut snaps, mut children) = (0, 0);
    for (key, value) in omap {
        let bytes = unhex(value);
        let (key, value) = if key.starts_with("snapshot_") {
            snaps += 1;
            let masked: String = masked_snapshot(value)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            (format!("snapshot_#{snaps}"), Value::String(masked))
        } else if key.starts_with("snap_children_") {
            children += 1;
            (
                format!("snap_children_#{children}"),
                decode_children(&bytes, ids),
            )
        } else if key == "parent" {
            (key.clone(), decode_parent(&bytes, ids))
        } else if key == "object_prefix" {
            let prefix = Reader(&bytes).string();
            let own = prefix == format!("rbd_data.{own_id}");
            (
                key.clone(),
                Value::String(if own {
                    "rbd_data.<own ID>".into()
                } else {
                    prefix
                }),
            )
        } else if compared_by_length(key) {
            (key.clone(), Value::String(format!("{} bytes", bytes.len())))
        } else {
            (key.clone(), Value::String(value.clone()))
        };
        numbered.insert(key, value);
    }
    numbered
}

/// The librbd side's name for `what`, and the RADOS side's: of equal length.
fn names(what: &str) -> (String, String) {
    let n = std::process::id();
    (format!("d-lib-{what}-{n}"), format!("d-rad-{what}-{n}"))
}

/// JSON from the `rbd` CLI with every name made side-neutral and IDs and times dropped.
fn rbd_json(args: &[&str]) -> Value {
    let out = micro_ceph::cluster()
        .rbd(args)
        .unwrap_or_else(|e| panic!("rbd {}: {e}", args.join(" ")));
    let neutral = out.replace("d-lib-", "d-X-").replace("d-rad-", "d-X-");
    let mut value: Value = serde_json::from_str(&neutral)
        .unwrap_or_else(|e| panic!("rbd {}: {e}: {out}", args.join(" ")));
    strip(&mut value);
    value
}

fn strip(value: &mut Value) {
    const DROPPED: [&str; 7] = [
        "id",
        "block_name_prefix",
        "create_timestamp",
        "access_timestamp",
        "modify_timestamp",
        "timestamp",
        "snapshot_id",
    ];
    match value {
        Value::Object(map) => {
            for key in DROPPED {
                map.remove(key);
            }
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => items.iter_mut().for_each(strip),
        // a trashed snapshot is renamed to a random UUID
        Value::String(text) if is_uuid(text) => *text = "<uuid>".to_owned(),
        _ => {}
    }
}

fn image_id(image: &str) -> String {
    let out = micro_ceph::cluster()
        .rbd(&[
            "info",
            "--format",
            "json",
            &format!("{}/{image}", pool_name()),
        ])
        .unwrap();
    serde_json::from_str::<Value>(&out).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The RADOS objects of the image whose ID is `id` (and name `name`), with the ID, name and
/// snapshot IDs made neutral.
fn objects_of(name: &str, id: &str) -> Vec<String> {
    let listed = micro_ceph::cluster()
        .rados(&["-p", &pool_name(), "ls"])
        .unwrap();
    let mut objects: Vec<String> = listed
        .lines()
        .filter(|o| o.contains(id) || o.ends_with(&format!("rbd_id.{name}")))
        .map(|o| {
            let o = o
                .replace(id, "ID")
                .replace("d-lib-", "d-X-")
                .replace("d-rad-", "d-X-");
            // a snapshot's object map is named after the snapshot's ID
            match o.strip_prefix("rbd_object_map.ID.") {
                Some(_) => "rbd_object_map.ID.<snapshot ID>".to_owned(),
                None => o,
            }
        })
        .collect();
    objects.sort();
    objects
}

/// Everything the module's text lists, for one image (and its snapshots), side-neutral.
fn what_librbd_sees(image: &str) -> Value {
    let pool = pool_name();
    let spec = format!("{pool}/{image}");
    let id = image_id(image);
    let omap = omaps(&[format!("rbd_header.{id}")])
        .into_values()
        .next()
        .unwrap_or_default();
    let raw_info: Value = serde_json::from_str(
        &micro_ceph::cluster()
            .rbd(&["info", "--format", "json", &spec])
            .unwrap(),
    )
    .unwrap();
    // every image's ID named after its (side-neutral) name, from the pool's directory
    let mut ids: BTreeMap<String, String> = omaps(&["rbd_directory".to_owned()])
        .into_values()
        .next()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(key, value)| {
            let id = key.strip_prefix("id_")?.to_owned();
            let name = Reader(&unhex(&value))
                .string()
                .replace("d-lib-", "d-X-")
                .replace("d-rad-", "d-X-");
            Some((id, format!("<ID of {name}>")))
        })
        .collect();
    ids.insert(id.clone(), "<own ID>".to_owned());
    if let Some(parent) = raw_info["parent"]["id"].as_str() {
        ids.insert(parent.to_owned(), "<parent's ID>".to_owned());
    }
    let info = rbd_json(&["info", "--format", "json", &spec]);
    let snaps = rbd_json(&["snap", "ls", "--all", "--format", "json", &spec]);
    let features: Vec<String> = info["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    let ceph = micro_ceph::cluster();
    let mut checked = Vec::new();
    if features.iter().any(|f| f == "object-map") {
        ceph.rbd(&["object-map", "check", &spec])
            .unwrap_or_else(|e| panic!("object-map check {spec}: {e}"));
        checked.push(spec.clone());
    }
    let mut diffs = vec![rbd_json(&["diff", "--format", "json", &spec])];
    let mut children = Vec::new();
    // the user snapshots' names as they are (the neutral JSON names them alike)
    let listed = ceph
        .rbd(&["snap", "ls", "--format", "json", &spec])
        .unwrap();
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap();
    for snap in &listed {
        let at = format!("{spec}@{}", snap["name"].as_str().unwrap());
        if features.iter().any(|f| f == "object-map") {
            ceph.rbd(&["object-map", "check", &at])
                .unwrap_or_else(|e| panic!("object-map check {at}: {e}"));
            checked.push(at.clone());
        }
        diffs.push(rbd_json(&["diff", "--format", "json", &at]));
        children.push(rbd_json(&["children", "--all", "--format", "json", &at]));
    }
    serde_json::json!({
        "info": info,
        "snapshots": snaps,
        "object maps checked": checked.len(),
        "diffs": diffs,
        "children": children,
        "objects": objects_of(image, &id),
        "header omap": comparable_omap(&omap, &id, &ids),
    })
}

/// Asserts the two sides alike, naming the first difference.
fn assert_alike(what: &str, lib: &Value, rad: &Value) {
    let (mut lib, mut rad) = (lib.clone(), rad.clone());
    // snapshot records: alike but for their times, then left out of the rest
    let (lib_omap, rad_omap) = (
        lib["header omap"].as_object_mut().unwrap(),
        rad["header omap"].as_object_mut().unwrap(),
    );
    let snapshot_keys: Vec<String> = lib_omap
        .keys()
        .filter(|k| k.starts_with("snapshot_#"))
        .cloned()
        .collect();
    for key in snapshot_keys {
        let (a, b) = (lib_omap.remove(&key), rad_omap.remove(&key));
        let (a, b) = (
            unhex(a.as_ref().and_then(Value::as_str).unwrap_or_default()),
            unhex(b.as_ref().and_then(Value::as_str).unwrap_or_default()),
        );
        assert!(
            alike_snapshots(&a, &b),
            "{what}: header omap {key} differs beyond its time: {a:02x?} != {b:02x?}"
        );
    }
    if lib == rad {
        return;
    }
    let (lib_map, rad_map) = (lib.as_object().unwrap(), rad.as_object().unwrap());
    for (key, value) in lib_map {
        assert_eq!(
            Some(value),
            rad_map.get(key),
            "{what}: {key} differs between librbd (left) and the RADOS-level path (right)"
        );
    }
    panic!("{what}: {lib} != {rad}");
}

fn trash() -> Value {
    rbd_json(&["trash", "ls", "--all", "--format", "json", &pool_name()])
}

/// Writes 1 MiB in 64 KiB pieces spread over `image`, the same bytes on every image.
fn fill(image: &str) {
    micro_ceph::cluster()
        .rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-pattern",
            "seq",
            "--io-size",
            "64K",
            "--io-total",
            "1M",
            &format!("{}/{image}", pool_name()),
        ])
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rados_level_paths_leave_what_librbd_leaves() {
    if ceph_rbd::librbd_only() {
        eprintln!(
            "{} is set: no RADOS-level path to compare",
            ceph_rbd::LIBRBD_ONLY_ENV
        );
        return;
    }
    let cluster = connect().await;
    let pool = pool_name();
    let trash_before = trash();
    let plain = "layering,exclusive-lock,object-map,fast-diff,deep-flatten";

    // creates: each feature set the provisioner asks for (a class without `imageFeatures`
    // gets the full set; without features librbd's defaults apply and librbd creates), and an
    // object size of its own
    let sets: [(&str, Option<&str>, Option<u64>); 5] = [
        ("layering", Some("layering"), None),
        ("lock", Some("layering,exclusive-lock"), None),
        (
            "map",
            Some("layering,exclusive-lock,object-map,fast-diff"),
            None,
        ),
        ("all", Some(plain), None),
        ("order20", Some(plain), Some(1 << 20)),
    ];
    for (what, features, object_size) in sets {
        let opts = CreateOptions {
            features: features.map(|f| Features::parse(f).unwrap()),
            object_size,
            ..CreateOptions::default()
        };
        let (lib, rad) = names(&format!("create-{what}"));
        ceph_rbd::set_librbd_only(true);
        cluster
            .create_image(&pool, &lib, 64 << 20, &opts)
            .await
            .unwrap();
        ceph_rbd::set_librbd_only(false);
        let before = ceph_rbd::created_without_librbd();
        cluster
            .create_image(&pool, &rad, 64 << 20, &opts)
            .await
            .unwrap();
        assert_eq!(ceph_rbd::created_without_librbd(), before + 1, "{what}");
        assert_alike(
            &format!("create {what}"),
            &what_librbd_sees(&lib),
            &what_librbd_sees(&rad),
        );
    }

    // a clone of a snapshot (a restore), each side its own parent made alike through librbd
    let opts = CreateOptions {
        features: Some(Features::parse(plain).unwrap()),
        ..CreateOptions::default()
    };
    let (parent_lib, parent_rad) = names("parent");
    let (clone_lib, clone_rad) = names("clone");
    for parent in [&parent_lib, &parent_rad] {
        ceph_rbd::set_librbd_only(true);
        cluster
            .create_image(&pool, parent, 8 << 20, &opts)
            .await
            .unwrap();
        fill(parent);
        cluster.snap_create(&pool, parent, "s").await.unwrap();
        ceph_rbd::set_librbd_only(false);
    }
    let job = |parent: &str, image: &str, temporary: bool, snap: &str, snapshot| CloneJob {
        parent_pool: pool.clone(),
        parent: parent.to_owned(),
        snap: snap.to_owned(),
        temporary,
        pool: pool.clone(),
        image: image.to_owned(),
        options: opts.clone(),
        snapshot,
    };
    ceph_rbd::set_librbd_only(true);
    cluster
        .clone_recorded(job(&parent_lib, &clone_lib, false, "s", None), |_| {
            CloneRecord::default()
        })
        .await
        .unwrap();
    ceph_rbd::set_librbd_only(false);
    let before = ceph_rbd::cloned_without_librbd();
    cluster
        .clone_recorded(job(&parent_rad, &clone_rad, false, "s", None), |_| {
            CloneRecord::default()
        })
        .await
        .unwrap();
    assert_eq!(ceph_rbd::cloned_without_librbd(), before + 1);
    assert_alike(
        "clone",
        &what_librbd_sees(&clone_lib),
        &what_librbd_sees(&clone_rad),
    );
    assert_alike(
        "the clone's parent",
        &what_librbd_sees(&parent_lib),
        &what_librbd_sees(&parent_rad),
    );

    // a snapshot image: the source's temporary snapshot (under its exclusive lock), the clone,
    // the temporary snapshot trashed, the new image's first snapshot
    let (source_lib, source_rad) = names("source");
    let (snap_lib, snap_rad) = names("snapimg");
    for source in [&source_lib, &source_rad] {
        ceph_rbd::set_librbd_only(true);
        cluster
            .create_image(&pool, source, 8 << 20, &opts)
            .await
            .unwrap();
        fill(source);
        ceph_rbd::set_librbd_only(false);
    }
    ceph_rbd::set_librbd_only(true);
    cluster
        .clone_recorded(
            job(&source_lib, &snap_lib, true, "tmp", Some(snap_lib.clone())),
            |_| CloneRecord::default(),
        )
        .await
        .unwrap();
    ceph_rbd::set_librbd_only(false);
    let before = (
        ceph_rbd::cloned_without_librbd(),
        ceph_rbd::snapshots_without_librbd(),
    );
    cluster
        .clone_recorded(
            job(&source_rad, &snap_rad, true, "tmp", Some(snap_rad.clone())),
            |_| CloneRecord::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            ceph_rbd::cloned_without_librbd(),
            ceph_rbd::snapshots_without_librbd()
        ),
        (before.0 + 1, before.1 + 2),
        "the clone, the temporary snapshot and the first snapshot without librbd"
    );
    assert_alike(
        "snapshot image",
        &what_librbd_sees(&snap_lib),
        &what_librbd_sees(&snap_rad),
    );
    assert_alike(
        "the source after its temporary snapshot",
        &what_librbd_sees(&source_lib),
        &what_librbd_sees(&source_rad),
    );

    // removals of plain images with data
    let (removed_lib, removed_rad) = names("remove");
    let mut ids = Vec::new();
    for image in [&removed_lib, &removed_rad] {
        ceph_rbd::set_librbd_only(true);
        cluster
            .create_image(&pool, image, 8 << 20, &opts)
            .await
            .unwrap();
        ceph_rbd::set_librbd_only(false);
        fill(image);
        ids.push(image_id(image));
    }
    ceph_rbd::set_librbd_only(true);
    cluster.remove_image(&pool, &removed_lib).await.unwrap();
    ceph_rbd::set_librbd_only(false);
    let before = ceph_rbd::removed_without_librbd();
    cluster.remove_image(&pool, &removed_rad).await.unwrap();
    assert_eq!(ceph_rbd::removed_without_librbd(), before + 1);
    for (image, id) in [&removed_lib, &removed_rad].into_iter().zip(&ids) {
        assert_eq!(objects_of(image, id), Vec::<String>::new(), "{image}");
        assert!(
            !cluster.image_exists(&pool, image).await.unwrap(),
            "{image}"
        );
    }
    assert_eq!(trash(), trash_before, "the trash");
}
