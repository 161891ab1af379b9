//! SMC connections over a link: link groups, their driver tasks, and the manager (one per
//! context) that creates and reuses them, with its shared-memory side in [`shm`] and its RDMA
//! side in `rdma` (feature `rdma`).

/// Who a same-host client is, as its door registration proved it: from the kernel
/// (`SO_PEERCRED`) and the registration. Link groups are found and shared by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientIdentity {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    /// The client's link-group manager instance: a restarted process with a reused pid is
    /// another client.
    pub(crate) instance: u64,
}

pub(crate) mod conn;
pub(crate) mod group;
pub(crate) mod handback;
pub(crate) mod manager;
#[cfg(feature = "rdma")]
pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp_end;
