//! redlock-mux: Redlock distributed locks over N independent Redis masters.

pub mod resp;
