//! Masters managed by Redis Sentinel (a master, a replica, three sentinels per member): the
//! kit's, shared with `bench --sentinel`.

pub use redlock_mux_kit::sentinel::*;
