//! What both front ends share (HTTP and Flight SQL): the engine, the API tokens and the
//! result caps. Its own module so the front ends are siblings that import neither each other.

use skiff_engine::Engine;

use crate::auth::Auth;

/// What every handler shares.
pub struct AppState {
    pub engine: Engine,
    pub auth: Auth,
    pub catalog_kind: &'static str,
    pub max_body_bytes: usize,
    pub max_result_rows: u64,
    pub max_result_bytes: u64,
    /// `/metrics` without a token.
    pub metrics_public: bool,
}

/// The limits on one result's size.
#[derive(Debug, Clone, Copy)]
pub struct Cap {
    pub rows: u64,
    pub bytes: u64,
}

impl AppState {
    pub fn result_cap(&self) -> Cap {
        Cap { rows: self.max_result_rows, bytes: self.max_result_bytes }
    }
}
