//! Controller tests against the in-process `kube_emulator::Emulator` with an in-memory backend.
//! One test binary (faster to build); each test gets its own emulator.

mod common;

mod attach;
mod delete;
mod events;
mod expand;
mod failures;
mod leader;
mod modify;
mod paged;
mod provision;
mod snapshots;
