//! Encodings of record batches for the wire: JSON rows and Arrow IPC streams. Each Arrow
//! type's JSON form is decided in `json` alone; Basin's envelope builds on it.

pub mod arrow_ipc;
pub mod basin;
pub mod json;
