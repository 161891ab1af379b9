//! SMC connections over a link: link groups, their driver tasks, and the process-wide manager
//! that creates and reuses them.

pub(crate) mod conn;
pub(crate) mod group;
pub(crate) mod manager;
#[cfg(feature = "rdma")]
pub(crate) mod rdma;
