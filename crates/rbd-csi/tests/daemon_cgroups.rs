//! `--daemon-cgroup` on this host's real cgroups: the one directory the DaemonSet names
//! (`/sys/fs/cgroup/NAME`, the host's `/sys/fs/cgroup` at `/host-cgroup` in the pod) resolves
//! to one cgroup per mounted hierarchy on a cgroup v1 host and to itself on cgroup v2, and a
//! daemon started through [`DaemonPlacement`] is in every one of them, cpuset included. Needs
//! root; every cgroup and mount made here is removed, also when an assertion fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use rbd_csi::mapper::cgroup;
use rbd_csi::mapper::daemon::DaemonPlacement;

#[path = "common/cgroups.rs"]
mod cgroups;

fn unique(what: &str) -> String {
    format!("rbd-csi-test-{}-{what}", std::process::id())
}

/// A daemon started through `placement` (`sleep`), killed on drop.
struct Daemon(tokio::process::Child);

impl Daemon {
    fn start(placement: &DaemonPlacement) -> Daemon {
        let child = placement
            .command("sleep")
            .unwrap()
            .arg("300")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Daemon(child)
    }

    fn pid(&self) -> u32 {
        self.0.id().unwrap()
    }

    /// `/proc/PID/cgroup`: each hierarchy's line, `ID:CONTROLLERS:PATH`.
    fn cgroup_lines(&self) -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid()))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    async fn stop(mut self) {
        self.0.kill().await.unwrap();
    }
}

#[test]
fn the_cgroup_v1_root_resolves_to_one_cgroup_in_each_mounted_hierarchy() {
    let name = unique("resolve");
    let configured = Path::new(cgroups::ROOT).join(&name);
    let resolved = cgroup::resolve(&configured).unwrap();
    let expected = cgroups::in_every_hierarchy(&name);
    assert_eq!(resolved, expected, "one cgroup per hierarchy, sorted");
    let hierarchies = cgroups::hierarchies();
    if hierarchies != [PathBuf::from(cgroups::ROOT)] {
        // A cgroup v1 host: the controllers that decide whether a daemon is killed with the
        // plugin's container are there, and v2's root is no hierarchy of its own.
        for controller in ["cpuset", "devices", "freezer", "memory", "pids"] {
            assert!(
                resolved.iter().any(|dir| {
                    let hierarchy = dir.parent().unwrap().file_name().unwrap();
                    hierarchy
                        .to_string_lossy()
                        .split(',')
                        .any(|c| c == controller)
                }),
                "no {controller} hierarchy in {resolved:?}"
            );
        }
    }
    assert!(
        resolved.iter().all(|dir| !dir.exists()),
        "resolving creates nothing"
    );
}

#[test]
fn a_directory_inside_a_hierarchy_is_used_as_is() {
    let inside = cgroups::hierarchies()[0].join(unique("as-is"));
    assert_eq!(
        cgroup::resolve(&inside).unwrap(),
        std::slice::from_ref(&inside)
    );
    let nested = inside.join("nested");
    assert_eq!(cgroup::resolve(&nested).unwrap(), [nested]);
}

#[tokio::test]
async fn a_daemon_joins_its_new_cgroup_in_every_hierarchy_cpuset_included() {
    let name = unique("daemon");
    let expected = cgroups::in_every_hierarchy(&name);
    let _made = cgroups::Made(expected.clone());
    let placement = DaemonPlacement::resolve(&[Path::new(cgroups::ROOT).join(&name)]).unwrap();
    assert_eq!(placement.cgroups, expected);

    let daemon = Daemon::start(&placement);
    for dir in &expected {
        assert_eq!(
            cgroups::procs(dir),
            [daemon.pid()],
            "the daemon is in {}",
            dir.display()
        );
    }
    let lines = daemon.cgroup_lines();
    assert_eq!(lines.len(), expected.len(), "{lines:?}");
    for line in &lines {
        assert!(line.ends_with(&format!(":/{name}")), "{line}");
    }
    if let Some(cpuset) = expected
        .iter()
        .find(|d| d.parent().unwrap().ends_with("cpuset"))
    {
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = std::fs::read_to_string(cpuset.join(file)).unwrap();
            let parent = std::fs::read_to_string(cpuset.parent().unwrap().join(file)).unwrap();
            assert!(!own.trim().is_empty(), "{file} filled");
            assert_eq!(own, parent, "{file} is the parent's");
        }
    }
    daemon.stop().await;
}

#[tokio::test]
async fn a_new_cpuset_cgroup_and_its_new_parents_get_their_parents_cpus_and_mems() {
    let cpuset = Path::new(cgroups::ROOT).join("cpuset");
    if cgroups::hierarchies() == [PathBuf::from(cgroups::ROOT)] {
        // cgroup v2 needs no filling; the v2 test below covers that host.
        return;
    }
    let outer = cpuset.join(unique("cpuset"));
    let inner = outer.join("inner");
    let _made = cgroups::Made(vec![outer.clone(), inner.clone()]);
    // What the kernel does without the filling: an empty cpuset that refuses every process.
    std::fs::create_dir(&outer).unwrap();
    let empty = std::fs::read_to_string(outer.join("cpuset.cpus")).unwrap();
    assert_eq!(
        empty.trim(),
        "",
        "a new v1 cpuset starts empty on this host"
    );
    std::fs::remove_dir(&outer).unwrap();

    let placement = DaemonPlacement::resolve(std::slice::from_ref(&inner)).unwrap();
    for dir in [&outer, &inner] {
        for file in ["cpuset.cpus", "cpuset.mems"] {
            assert_eq!(
                std::fs::read_to_string(dir.join(file)).unwrap(),
                std::fs::read_to_string(cpuset.join(file)).unwrap(),
                "{} {file}",
                dir.display()
            );
        }
    }
    let daemon = Daemon::start(&placement);
    assert_eq!(cgroups::procs(&inner), [daemon.pid()]);
    daemon.stop().await;
}

#[tokio::test]
async fn a_directory_in_the_cgroup_v2_hierarchy_is_used_as_is() {
    let v2 = cgroups::v2_hierarchy().expect("a cgroup v2 mount (hybrid hosts have unified)");
    let name = unique("v2");
    let dir = v2.join(&name);
    let _made = cgroups::Made(vec![dir.clone()]);
    assert_eq!(cgroup::resolve(&dir).unwrap(), std::slice::from_ref(&dir));
    let placement = DaemonPlacement::resolve(std::slice::from_ref(&dir)).unwrap();
    assert_eq!(placement.cgroups, std::slice::from_ref(&dir));
    assert!(dir.join("cgroup.controllers").exists(), "a v2 cgroup made");

    let daemon = Daemon::start(&placement);
    assert_eq!(cgroups::procs(&dir), [daemon.pid()]);
    assert!(
        daemon.cgroup_lines().contains(&format!("0::/{name}")),
        "{:?}",
        daemon.cgroup_lines()
    );
    daemon.stop().await;
}

/// Mounts made in a temp dir, unmounted (recursively) on drop.
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for point in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-R").arg(point).status();
        }
    }
}

fn mount(args: &[&str], source: &Path, target: &Path) {
    std::fs::create_dir_all(target).unwrap();
    let status = Command::new("mount")
        .args(args)
        .arg(source)
        .arg(target)
        .status()
        .unwrap();
    assert!(status.success(), "mount {args:?} {}", source.display());
}

#[test]
fn the_daemonset_form_resolves_through_a_hostpath_style_recursive_bind_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let host_cgroup = tmp.path().join("host-cgroup");
    let mut mounts = Mounts(Vec::new());
    mount(&["--rbind"], Path::new(cgroups::ROOT), &host_cgroup);
    mounts.0.push(host_cgroup.clone());
    let name = unique("rbind");
    let expected: Vec<PathBuf> = cgroups::hierarchies()
        .iter()
        .map(|h| {
            host_cgroup
                .join(h.strip_prefix(cgroups::ROOT).unwrap())
                .join(&name)
        })
        .collect();
    assert_eq!(cgroup::resolve(&host_cgroup.join(&name)).unwrap(), expected);
    drop(mounts);
}

#[test]
fn a_hierarchy_under_several_names_or_mounts_counts_once() {
    let hierarchy = cgroups::hierarchies()
        .into_iter()
        .find(|h| h.as_path() != Path::new(cgroups::ROOT));
    let Some(hierarchy) = hierarchy else {
        // A cgroup v2 host has no v1 root to build.
        return;
    };
    // A v1 root of our own: one hierarchy bind-mounted twice, plus a symlink to it (as `cpu`
    // links to `cpu,cpuacct`) and a plain directory, which is no hierarchy.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut mounts = Mounts(Vec::new());
    for alias in ["a", "b"] {
        mount(&["--bind"], &hierarchy, &root.join(alias));
        mounts.0.push(root.join(alias));
    }
    std::os::unix::fs::symlink("a", root.join("link")).unwrap();
    std::fs::create_dir(root.join("plain")).unwrap();
    assert_eq!(
        cgroup::resolve(&root.join("x")).unwrap(),
        [root.join("a/x")],
        "one cgroup for the one hierarchy"
    );
    drop(mounts);
}
