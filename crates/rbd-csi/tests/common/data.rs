//! Image data read and written with python-rbd (librbd, not our code), on the test pool.

use std::process::Command;

const IO: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    if sys.argv[4] == 'w':
        img.write(sys.argv[6].encode(), int(sys.argv[5]))
    else:
        sys.stdout.write(img.read(int(sys.argv[5]), int(sys.argv[6])).decode('latin1'))
io.close(); c.shutdown()
";

fn python_io(image: &str, op: &str, offset: u64, arg: &str) -> String {
    let ceph = micro_ceph::cluster();
    let out = Command::new("/usr/bin/python3")
        .args(["-c", IO])
        .arg(&ceph.conf_path)
        .arg(&ceph.pool)
        .arg(image)
        .arg(op)
        .arg(offset.to_string())
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python-rbd {op} {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `text` at `offset` of the test pool's `image`.
pub fn write(image: &str, offset: u64, text: &str) {
    python_io(image, "w", offset, text);
}

/// Reads `len` bytes at `offset` of the test pool's `image`.
pub fn read(image: &str, offset: u64, len: usize) -> String {
    python_io(image, "r", offset, &len.to_string())
}
