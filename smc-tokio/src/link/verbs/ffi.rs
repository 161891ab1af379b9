//! The raw libibverbs interface: the few structures, constants and functions the verbs link
//! uses, with the library loaded at run time (`dlopen("libibverbs.so.1")`).
//!
//! Why hand-written and loaded at run time: the `ibverbs` crate's safe API has no completion
//! channel, posts SEND only and registers only memory it allocates; `ibverbs-sys` and `sideway`
//! need cmake and libclang at build time (our CI builds every feature). Loading the library at
//! run time also means a binary built with the `rdma` feature starts on a host without
//! rdma-core and simply offers no RDMA. The layouts below are x86-64/aarch64 LP64 layouts of
//! rdma-core's `<infiniband/verbs.h>` (ABI `IBVERBS_1.1`, stable since rdma-core v13); the
//! soft-RoCE test bed (`tests/rdma-vm/run.sh`) compiles a C program against the real header and
//! checks every offset used here against [`abi_report`].
//!
//! This is the only module that declares foreign functions or reads foreign structures; the rest
//! of the link uses the safe wrappers in `super::device`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `struct ibv_gid`: 16 raw bytes (the union's other view is two big-endian u64).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`, with the `wr` union as its `rdma` member and the trailing unions as
/// opaque space (this link never uses atomics, UD, XRC, memory windows or TSO).
#[repr(C)]
pub(crate) struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub _wr_rest: [u32; 5],
    pub _qp_type: [u32; 2],
    pub _bind_mw_tso: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub(crate) struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// The leading fields of `struct ibv_port_attr` that the exported (compat) `ibv_query_port`
/// fills, padded to the full structure's size so either variant fits.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub _rest: [u8; 96],
}

impl Default for ibv_port_attr {
    fn default() -> Self {
        ibv_port_attr { state: 0, max_mtu: 0, active_mtu: 0, gid_tbl_len: 0, _rest: [0; 96] }
    }
}

// Offsets into opaque structures, from rdma-core's verbs.h (LP64), checked by the test bed.
/// `offsetof(struct ibv_context, ops) + offsetof(struct ibv_context_ops, poll_cq)`.
pub(crate) const CTX_OPS_POLL_CQ: usize = 8 + 88;
/// `... + offsetof(struct ibv_context_ops, req_notify_cq)`.
pub(crate) const CTX_OPS_REQ_NOTIFY_CQ: usize = 8 + 96;
/// `... + offsetof(struct ibv_context_ops, post_send)`.
pub(crate) const CTX_OPS_POST_SEND: usize = 8 + 200;
/// `... + offsetof(struct ibv_context_ops, post_recv)`.
pub(crate) const CTX_OPS_POST_RECV: usize = 8 + 208;
/// `offsetof(struct ibv_qp, qp_num)`.
pub(crate) const QP_NUM: usize = 52;
/// `offsetof(struct ibv_mr, lkey)` (`rkey` follows it).
pub(crate) const MR_LKEY: usize = 36;
/// `offsetof(struct ibv_mr, rkey)`.
pub(crate) const MR_RKEY: usize = 40;
/// `offsetof(struct ibv_comp_channel, fd)`.
pub(crate) const CHANNEL_FD: usize = 8;
/// `offsetof(struct ibv_port_attr, link_layer)` in the full structure.
pub(crate) const PORT_LINK_LAYER: usize = 46;

pub(crate) const IBV_QPT_RC: c_uint = 2;
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
pub(crate) const IBV_QPS_ERR: c_uint = 6;
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 2;

pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_SEND: c_uint = 2;
pub(crate) const IBV_SEND_SIGNALED: c_uint = 2;
pub(crate) const IBV_SEND_INLINE: c_uint = 8;

pub(crate) const IBV_WC_SUCCESS: c_uint = 0;
pub(crate) const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub(crate) const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub(crate) const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;
pub(crate) const IBV_WC_RECV: c_uint = 128;

pub(crate) const IBV_QP_STATE: c_int = 1;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// The name of a work-completion status (`enum ibv_wc_status`), as `ibv_wc_status_str` has it.
pub(crate) fn wc_status_str(status: c_uint) -> &'static str {
    const NAMES: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "work request flushed",
        "memory window bind error",
        "bad response",
        "local access error",
        "remote invalid request",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation",
        "remote invalid RD request",
        "aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout",
        "general error",
    ];
    NAMES.get(status as usize).copied().unwrap_or("unknown status")
}

/// IB's path MTU enumeration (`enum ibv_mtu`): 256 << (value - 1) bytes.
pub(crate) fn mtu_bytes(v: c_uint) -> Option<u16> {
    match v {
        1..=5 => Some(256u16 << (v - 1)),
        _ => None,
    }
}

/// The `enum ibv_mtu` value of `bytes`.
pub(crate) fn mtu_enum(bytes: u16) -> Option<c_uint> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

pub(crate) type PollCqFn = unsafe extern "C" fn(cq: *mut c_void, n: c_int, wc: *mut ibv_wc) -> c_int;
pub(crate) type ReqNotifyFn = unsafe extern "C" fn(cq: *mut c_void, solicited_only: c_int) -> c_int;
pub(crate) type PostSendFn =
    unsafe extern "C" fn(qp: *mut c_void, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(qp: *mut c_void, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int;

/// The exported functions of libibverbs that the link calls.
pub(crate) struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut c_void, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut c_void, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_cq: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub get_cq_event: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut c_void, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut c_void,
    pub modify_qp: unsafe extern "C" fn(*mut c_void, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// The loaded library, or why it could not be loaded. Loaded once per process; never unloaded
/// (verbs objects live as long as the process may use them).
pub(crate) fn lib() -> Result<&'static Lib, &'static str> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(|e| e.as_str())
}

/// Reinterprets a symbol address as the function-pointer type `F`.
///
/// # Safety
/// `p` must be the address of a function whose signature `F` spells out.
pub(crate) unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: F is a function-pointer type of pointer size (asserted); per the contract, `p`
    // points to a function of that signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn load() -> Result<Lib, String> {
    let name = c"libibverbs.so.1";
    // SAFETY: `name` is a valid C string; dlopen has no other preconditions. Loading runs the
    // library's constructors, which only set up its own state.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "dlopen failed".to_owned()
        } else {
            // SAFETY: non-null dlerror results are valid C strings until the next dl* call.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        return Err(format!("libibverbs.so.1 not loadable: {msg}"));
    }
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: `h` is a live handle and the name a valid C string.
            let p = unsafe { libc::dlsym(h, concat!($name, "\0").as_ptr().cast()) };
            if p.is_null() {
                return Err(format!("libibverbs.so.1 lacks {}", $name));
            }
            // SAFETY: the symbol is the libibverbs function of that name (default version,
            // IBVERBS_1.1), whose C signature the field's type spells out.
            unsafe { fn_ptr(p) }
        }};
    }
    Ok(Lib {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_comp_channel: sym!("ibv_create_comp_channel"),
        destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        get_cq_event: sym!("ibv_get_cq_event"),
        ack_cq_events: sym!("ibv_ack_cq_events"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
    })
}

// The hand-written layouts are LP64 ones: refuse to build the verbs link anywhere else rather
// than pass the library structures of another layout.
#[cfg(not(all(
    target_os = "linux",
    target_pointer_width = "64",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("the `rdma` feature supports 64-bit Linux on x86-64 and aarch64 only (the verbs structures are hand-written LP64 layouts)");

/// The layout facts of rdma-core's `<infiniband/verbs.h>` on LP64 (every line of
/// [`abi_report`], with the values `tests/rdma-vm/abi.c` printed from rdma-core v44's header on
/// x86-64; the test bed re-checks them against the installed header), held at compile time: a
/// field moved by an edit fails the build, not a work request at run time.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(CTX_OPS_POLL_CQ == 96);
    assert!(CTX_OPS_REQ_NOTIFY_CQ == 104);
    assert!(CTX_OPS_POST_SEND == 208);
    assert!(CTX_OPS_POST_RECV == 216);
    assert!(QP_NUM == 52);
    assert!(MR_LKEY == 36);
    assert!(MR_RKEY == 40);
    assert!(CHANNEL_FD == 8);
    assert!(PORT_LINK_LAYER == 46);
    assert!(offset_of!(ibv_port_attr, gid_tbl_len) == 12);
    assert!(offset_of!(ibv_port_attr, active_mtu) == 8);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(ibv_qp_init_attr, cap) == 32);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(offset_of!(ibv_qp_init_attr, sq_sig_all) == 56);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, cap) == 36);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, max_rd_atomic) == 126);
    assert!(offset_of!(ibv_qp_attr, min_rnr_timer) == 128);
    assert!(offset_of!(ibv_qp_attr, port_num) == 129);
    assert!(offset_of!(ibv_qp_attr, timeout) == 130);
    assert!(offset_of!(ibv_qp_attr, retry_cnt) == 131);
    assert!(offset_of!(ibv_qp_attr, rnr_retry) == 132);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(offset_of!(ibv_ah_attr, dlid) == 24);
    assert!(offset_of!(ibv_ah_attr, is_global) == 29);
    assert!(offset_of!(ibv_ah_attr, port_num) == 30);
    assert!(offset_of!(ibv_global_route, sgid_index) == 20);
    assert!(offset_of!(ibv_global_route, hop_limit) == 21);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, num_sge) == 24);
    assert!(offset_of!(ibv_send_wr, opcode) == 28);
    assert!(offset_of!(ibv_send_wr, send_flags) == 32);
    assert!(offset_of!(ibv_send_wr, remote_addr) == 40);
    assert!(offset_of!(ibv_send_wr, rkey) == 48);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, status) == 8);
    assert!(offset_of!(ibv_wc, opcode) == 12);
    assert!(offset_of!(ibv_wc, byte_len) == 20);
    assert!(align_of::<ibv_gid>() == 8);
};

/// The layout facts this module relies on, one `name value` per line, in the same format as the
/// test bed's C checker prints them from the real header.
///
/// # Examples
///
/// ```
/// // One `name value` line per fact, to compare with what the C checker prints.
/// let report = smc_tokio::rdma::abi_report();
/// assert!(report.lines().any(|l| l == "send_wr_size 128"));
/// assert!(report.lines().all(|l| l.split(' ').count() == 2));
/// ```
pub fn abi_report() -> String {
    use std::mem::{align_of, offset_of, size_of};
    let lines: Vec<(&str, usize)> = vec![
        ("ctx_ops_poll_cq", CTX_OPS_POLL_CQ),
        ("ctx_ops_req_notify_cq", CTX_OPS_REQ_NOTIFY_CQ),
        ("ctx_ops_post_send", CTX_OPS_POST_SEND),
        ("ctx_ops_post_recv", CTX_OPS_POST_RECV),
        ("qp_num", QP_NUM),
        ("mr_lkey", MR_LKEY),
        ("mr_rkey", MR_RKEY),
        ("channel_fd", CHANNEL_FD),
        ("port_link_layer", PORT_LINK_LAYER),
        ("port_gid_tbl_len", offset_of!(ibv_port_attr, gid_tbl_len)),
        ("port_active_mtu", offset_of!(ibv_port_attr, active_mtu)),
        ("qp_init_attr_size", size_of::<ibv_qp_init_attr>()),
        ("qp_init_attr_cap", offset_of!(ibv_qp_init_attr, cap)),
        ("qp_init_attr_qp_type", offset_of!(ibv_qp_init_attr, qp_type)),
        ("qp_init_attr_sq_sig_all", offset_of!(ibv_qp_init_attr, sq_sig_all)),
        ("qp_attr_size", size_of::<ibv_qp_attr>()),
        ("qp_attr_cap", offset_of!(ibv_qp_attr, cap)),
        ("qp_attr_ah_attr", offset_of!(ibv_qp_attr, ah_attr)),
        ("qp_attr_pkey_index", offset_of!(ibv_qp_attr, pkey_index)),
        ("qp_attr_max_rd_atomic", offset_of!(ibv_qp_attr, max_rd_atomic)),
        ("qp_attr_min_rnr_timer", offset_of!(ibv_qp_attr, min_rnr_timer)),
        ("qp_attr_port_num", offset_of!(ibv_qp_attr, port_num)),
        ("qp_attr_timeout", offset_of!(ibv_qp_attr, timeout)),
        ("qp_attr_retry_cnt", offset_of!(ibv_qp_attr, retry_cnt)),
        ("qp_attr_rnr_retry", offset_of!(ibv_qp_attr, rnr_retry)),
        ("qp_attr_rate_limit", offset_of!(ibv_qp_attr, rate_limit)),
        ("ah_attr_size", size_of::<ibv_ah_attr>()),
        ("ah_attr_dlid", offset_of!(ibv_ah_attr, dlid)),
        ("ah_attr_is_global", offset_of!(ibv_ah_attr, is_global)),
        ("ah_attr_port_num", offset_of!(ibv_ah_attr, port_num)),
        ("grh_sgid_index", offset_of!(ibv_global_route, sgid_index)),
        ("grh_hop_limit", offset_of!(ibv_global_route, hop_limit)),
        ("send_wr_size", size_of::<ibv_send_wr>()),
        ("send_wr_num_sge", offset_of!(ibv_send_wr, num_sge)),
        ("send_wr_opcode", offset_of!(ibv_send_wr, opcode)),
        ("send_wr_send_flags", offset_of!(ibv_send_wr, send_flags)),
        ("send_wr_remote_addr", offset_of!(ibv_send_wr, remote_addr)),
        ("send_wr_rkey", offset_of!(ibv_send_wr, rkey)),
        ("recv_wr_size", size_of::<ibv_recv_wr>()),
        ("sge_size", size_of::<ibv_sge>()),
        ("wc_size", size_of::<ibv_wc>()),
        ("wc_status", offset_of!(ibv_wc, status)),
        ("wc_opcode", offset_of!(ibv_wc, opcode)),
        ("wc_byte_len", offset_of!(ibv_wc, byte_len)),
        ("gid_align", align_of::<ibv_gid>()),
    ];
    lines.into_iter().map(|(k, v)| format!("{k} {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values the test bed's C checker printed from rdma-core v44's verbs.h on x86-64
    /// (tests/rdma-vm/abi.c); the bed re-checks them against whatever header is installed.
    #[test]
    fn layout_matches_rdma_core_header() {
        let r = abi_report();
        for want in [
            "qp_init_attr_size 64",
            "qp_attr_size 144",
            "qp_attr_ah_attr 56",
            "qp_attr_rate_limit 136",
            "ah_attr_size 32",
            "ah_attr_is_global 29",
            "send_wr_size 128",
            "send_wr_remote_addr 40",
            "send_wr_rkey 48",
            "recv_wr_size 32",
            "wc_size 48",
            "wc_byte_len 20",
            "port_gid_tbl_len 12",
        ] {
            assert!(r.lines().any(|l| l == want), "{want} missing from:\n{r}");
        }
    }

    #[test]
    fn mtu_enum_round_trips() {
        for b in [256u16, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_enum(b).unwrap()), Some(b));
        }
        assert_eq!(mtu_enum(1500), None);
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }
}
