//! kube-emulator
