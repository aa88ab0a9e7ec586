//! provisioner
