//! redlock-mux: Redlock distributed locks over N independent Redis masters.

pub mod resp;
#[allow(dead_code)] // used by the lock scripts once they land
mod sha1;
