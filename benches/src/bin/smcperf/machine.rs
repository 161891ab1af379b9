//! The machine's own limits, measured in the same run as the transports so that every figure is
//! also a ratio to what the hardware can do at that moment (this VM drifts by 2x within an
//! hour): the round trip of one cache line between two CPUs (an atomic ping-pong, the floor
//! under any shared-memory round trip), a round trip between two tokio tasks through
//! `AsyncWrite`/`AsyncRead` over one line (the floor under any transport used as a tokio
//! stream), what one CPU copies per second, and what a ring between two CPUs carries per second
//! when one thread copies into it and the other out of it (the ceiling of a stream that copies
//! each byte once on each side, as a shared-memory transport does, with no transport around
//! it). Next to each rr run, [`handoff`] measures the round trip of that run's message, copied
//! in and out, at that moment.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::buf::PageBuf;
use super::report::median;

/// What the machine did during this run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// One round trip of a cache line between two threads on two CPUs, in microseconds (0: not
    /// measured, on a machine with one CPU, where the two threads could only take turns).
    pub(crate) pingpong_us: f64,
    /// The median round trip of a `--size 14` rr between two tokio tasks, each on a
    /// current-thread runtime of its own thread, through `write_all` and `read_exact` on a
    /// stream that carries each message in one cache line per direction and whose `poll_read`
    /// spins until the line changes, timed per round trip as the rr rows are (0: one CPU). What
    /// the `write_all` and `read_exact` futures, the `AsyncRead`/`AsyncWrite` calls and the
    /// cache line cost with no transport around them: the floor of an rr row through any tokio
    /// stream. (A read spins in its poll and never returns `Pending`, so no scheduler work is
    /// in it, as there is little in an rr row's round trip while its reader spins.)
    pub(crate) task_rt_us: f64,
    /// Bytes per second one CPU copies with `copy_from_slice`, 64 KiB at a time (the copy
    /// stays in the caches).
    pub(crate) memcpy_64k: f64,
    /// The same, 16 MiB at a time (the copy goes through memory).
    pub(crate) memcpy_16m: f64,
    /// Bytes per second through a 1 MiB ring in this process's memory between two threads: one
    /// copies 64 KiB writes in, the other copies out into a 64 KiB buffer (0: one CPU).
    pub(crate) ring_64k: f64,
}

/// The machine's CPU time so far, from the first line of `/proc/stat`: `(stolen, total)` in
/// clock ticks, summed over every CPU. `stolen` is the time a hypervisor ran something else
/// while this guest's CPUs wanted to run; `None` where the file or the field is missing.
pub(crate) fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_ticks(stat.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice` (`proc(5)`): steal is
/// the eighth value; guest time is already counted in user time, so the total leaves it out.
fn parse_cpu_ticks(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let steal = *v.get(7)?;
    Some((steal, v.iter().take(8).sum()))
}

/// The share of the machine's CPU time stolen between two readings of [`cpu_ticks`], in
/// percent (0 when either is missing or no time passed).
pub(crate) fn steal_percent(from: Option<(u64, u64)>, to: Option<(u64, u64)>) -> f64 {
    match (from, to) {
        (Some((s0, t0)), Some((s1, t1))) if t1 > t0 => 100.0 * s1.saturating_sub(s0) as f64 / (t1 - t0) as f64,
        _ => 0.0,
    }
}

/// Round trips per batch of the ping-pong, and batches (the median batch is reported). 20 000
/// round trips take 3-6 ms on the development VM at its usual 0.15-0.3 us.
const PINGPONG_ROUND_TRIPS: u64 = 20_000;
const PINGPONG_BATCHES: usize = 9;
/// A batch also ends after this long, whatever its count: a preempted thread (a busy host, a
/// guest whose CPUs are emulated) must not hold the run for seconds.
const PINGPONG_BATCH_MAX: Duration = Duration::from_millis(50);

/// How long each copy batch runs, and batches: 9 x 20 ms keeps the whole measurement near
/// 0.5 s, a small share of the default 25 s run.
const MEMCPY_BATCH: Duration = Duration::from_millis(20);
const MEMCPY_BATCHES: usize = 9;

/// The ring's size and the size of each write into it: a ring that holds one write only makes
/// the two sides take turns (5.6 GB/s against 15-18 on the development VM); from 256 KiB on the
/// rate stops growing. smc-tokio's rings grow to 1 MiB under a bulk stream.
const RING_SIZE: usize = 1 << 20;
const RING_WRITE: usize = 64 << 10;
/// Batches of the ring measure, each this long (the median is reported): 9 x 20 ms, as the copy.
const RING_BATCH: Duration = Duration::from_millis(20);
const RING_BATCHES: usize = 9;

/// A counter alone on its cache line, so the ping-pong moves one line and nothing else.
#[repr(align(128))]
struct Line(AtomicU64);

/// Measures the limits. `pin` puts the ping-pong's two threads on CPUs 0 and 1 (as `--pin` does
/// for the transports); otherwise the scheduler places them.
pub(crate) fn measure(pin: bool) -> Limits {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Limits {
        pingpong_us: if cpus >= 2 { pingpong(pin) } else { 0.0 },
        task_rt_us: if cpus >= 2 { task_pingpong(pin) } else { 0.0 },
        memcpy_64k: memcpy(64 << 10),
        memcpy_16m: memcpy(16 << 20),
        ring_64k: if cpus >= 2 { ring(pin) } else { 0.0 },
    }
}

/// The ring between two threads (see [`Limits::ring_64k`]).
struct Ring {
    /// `RING_SIZE` bytes. The writer writes only between `prod` and `cons + RING_SIZE`, the
    /// reader reads only between `cons` and `prod`: the two never touch the same byte at once.
    buf: *mut u8,
    /// Bytes written (Release by the writer after its copy, Acquire by the reader before its).
    prod: Line,
    /// Bytes read (Release by the reader after its copy, Acquire by the writer before it
    /// overwrites them).
    cons: Line,
    /// Set by the writer when it stops (the reader drains and ends).
    done: std::sync::atomic::AtomicBool,
}

// SAFETY: `buf` is only accessed under the cursor protocol described on the fields: each byte
// is either the writer's or the reader's at any time, handed over with Release/Acquire.
unsafe impl Send for Ring {}
// SAFETY: as for Send.
unsafe impl Sync for Ring {}

/// The median over batches of the ring's rate.
fn ring(pin: bool) -> f64 {
    let mut mem = PageBuf::new(RING_SIZE, 0);
    let r = Arc::new(Ring {
        buf: mem.as_mut_ptr(),
        prod: Line(AtomicU64::new(0)),
        cons: Line(AtomicU64::new(0)),
        done: std::sync::atomic::AtomicBool::new(false),
    });
    let reader = {
        let r = r.clone();
        std::thread::spawn(move || {
            if pin {
                super::pin_to(1);
            }
            let mut out = PageBuf::new(RING_WRITE, 0);
            loop {
                let c = r.cons.0.load(Ordering::Relaxed);
                let p = r.prod.0.load(Ordering::Acquire);
                if p == c {
                    if r.done.load(Ordering::Acquire) && r.prod.0.load(Ordering::Acquire) == c {
                        return;
                    }
                    std::hint::spin_loop();
                    continue;
                }
                let at = (c % RING_SIZE as u64) as usize;
                let n = ((p - c) as usize).min(RING_SIZE - at).min(RING_WRITE);
                // SAFETY: [at, at + n) lies in the ring and between `cons` and `prod`: written
                // (Acquire on `prod`), and not written again until `cons` passes it.
                let src = unsafe { std::slice::from_raw_parts(r.buf.add(at), n) };
                black_box(&mut out[..n]).copy_from_slice(src);
                r.cons.0.store(c + n as u64, Ordering::Release);
            }
        })
    };
    let writer = std::thread::spawn(move || {
        if pin {
            super::pin_to(0);
        }
        let src = PageBuf::new(RING_WRITE, 0x5a);
        let mut batches = Vec::with_capacity(RING_BATCHES);
        for _ in 0..RING_BATCHES {
            let start = Instant::now();
            let mut sent = 0u64;
            while start.elapsed() < RING_BATCH {
                let mut done = 0;
                while done < RING_WRITE {
                    let p = r.prod.0.load(Ordering::Relaxed);
                    let c = r.cons.0.load(Ordering::Acquire);
                    let free = RING_SIZE - (p - c) as usize;
                    if free == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let at = (p % RING_SIZE as u64) as usize;
                    let n = free.min(RING_SIZE - at).min(RING_WRITE - done);
                    // SAFETY: [at, at + n) lies in the ring and between `prod` and `cons +
                    // RING_SIZE`: read already (Acquire on `cons`), and not read again until
                    // `prod` passes it.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), r.buf.add(at), n) };
                    r.prod.0.store(p + n as u64, Ordering::Release);
                    done += n;
                }
                sent += RING_WRITE as u64;
            }
            batches.push(sent as f64 / start.elapsed().as_secs_f64());
        }
        r.done.store(true, Ordering::Release);
        median(batches)
    });
    let rate = writer.join().unwrap_or(0.0);
    let _ = reader.join();
    // The threads are gone: nothing points into the ring any more.
    drop(mem);
    rate
}

/// The median over batches of one round trip: the initiator stores an odd value and spins
/// until the responder stored the next even one.
fn pingpong(pin: bool) -> f64 {
    /// The initiator's "stop": odd values ask for an answer, this one ends the responder.
    const STOP: u64 = u64::MAX;
    let line = Arc::new(Line(AtomicU64::new(0)));
    let responder = {
        let line = line.clone();
        std::thread::spawn(move || {
            if pin {
                super::pin_to(1);
            }
            loop {
                // Acquire/Release: each side's store is what the other waits to see; no other
                // data rides on it, so the orderings only keep the loop honest.
                let v = line.0.load(Ordering::Acquire);
                if v == STOP {
                    return;
                }
                if v % 2 == 1 {
                    line.0.store(v + 1, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    // The initiator runs on a thread of its own too, so that `--pin` does not move the caller.
    let initiator = std::thread::spawn(move || {
        if pin {
            super::pin_to(0);
        }
        let mut batches = Vec::with_capacity(PINGPONG_BATCHES);
        let mut i = 0u64;
        for _ in 0..PINGPONG_BATCHES {
            let start = Instant::now();
            let mut n = 0u64;
            while n < PINGPONG_ROUND_TRIPS && (n % 256 != 0 || start.elapsed() < PINGPONG_BATCH_MAX) {
                line.0.store(2 * i + 1, Ordering::Release);
                while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                    std::hint::spin_loop();
                }
                i += 1;
                n += 1;
            }
            batches.push(start.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64);
        }
        line.0.store(STOP, Ordering::Release);
        median(batches)
    });
    let us = initiator.join().unwrap_or(0.0);
    let _ = responder.join();
    us
}

/// How long the handoff measure runs on each side of an rr run, in batches: 4 x 5 ms before
/// and as many after keep it to a twentieth of a second per run, short against the VM's phases
/// (a line's crossing cost held for seconds, then changed by 3-8x, in a pinned C loop), long
/// enough for a few thousand round trips even at 1 KiB in the slowest phase seen (1.6 us).
const HANDOFF_BATCH: Duration = Duration::from_millis(5);
const HANDOFF_BATCHES: usize = 4;

/// One direction of [`handoff`]: a message buffer and the number of messages published in it.
struct Handoff {
    /// `size` bytes. The writer writes it only after it saw the answer to its last message, the
    /// reader reads it only between seeing `seq` move and publishing its answer: each byte is
    /// one thread's at a time.
    buf: *mut u8,
    /// Messages published (Release by the writer after its copy in, Acquire by the reader
    /// before its copy out).
    seq: Line,
}

// SAFETY: `buf` is accessed only under the protocol on the fields: a message is handed over
// with Release/Acquire on `seq`, and the other side writes the buffer again only after it saw
// that message's answer.
unsafe impl Send for Handoff {}
// SAFETY: as for Send.
unsafe impl Sync for Handoff {}

/// The round trip, in microseconds, of a `size`-byte message between two threads through one
/// buffer per direction, each side copying it in and out with `copy_from_slice`: the initiator
/// copies its message into the forward buffer and publishes it; the responder copies it out,
/// copies it into the reply buffer and publishes that; the initiator copies the reply out. What
/// any transport that copies a message through memory both CPUs see pays, with nothing of a
/// transport around it. Returns each batch's mean round trip, in microseconds (none on one
/// CPU). Run just before an rr run and just after it, the median of both calls' batches is the
/// machine's floor at the moment of that run, where [`Limits`] holds the best of the whole
/// invocation.
pub(crate) fn handoff(size: usize, pin: bool) -> Vec<f64> {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 || size == 0 {
        return Vec::new();
    }
    /// The initiator's "stop", published on the forward direction.
    const STOP: u64 = u64::MAX;
    let mut fwd_mem = PageBuf::new(size, 0);
    let mut back_mem = PageBuf::new(size, 0);
    let fwd = Arc::new(Handoff { buf: fwd_mem.as_mut_ptr(), seq: Line(AtomicU64::new(0)) });
    let back = Arc::new(Handoff { buf: back_mem.as_mut_ptr(), seq: Line(AtomicU64::new(0)) });
    let responder = {
        let (fwd, back) = (fwd.clone(), back.clone());
        std::thread::spawn(move || {
            if pin {
                super::pin_to(1);
            }
            let mut mine = PageBuf::new(size, 0);
            let mut seen = 0u64;
            loop {
                let v = fwd.seq.0.load(Ordering::Acquire);
                if v == STOP {
                    return;
                }
                if v == seen {
                    std::hint::spin_loop();
                    continue;
                }
                seen = v;
                // SAFETY: message `v` was published (Acquire above) and the initiator writes
                // the forward buffer again only after it saw this message's answer.
                black_box(&mut mine[..]).copy_from_slice(unsafe { std::slice::from_raw_parts(fwd.buf, size) });
                // SAFETY: the initiator reads the reply buffer only after `back.seq` reaches
                // `v` (stored below), and read the last reply before it published `v`.
                unsafe { std::ptr::copy_nonoverlapping(black_box(&mine[..]).as_ptr(), back.buf, size) };
                back.seq.0.store(v, Ordering::Release);
            }
        })
    };
    let initiator = std::thread::spawn(move || {
        if pin {
            super::pin_to(0);
        }
        let msg = PageBuf::new(size, 0x5a);
        let mut reply = PageBuf::new(size, 0);
        let mut batches = Vec::with_capacity(HANDOFF_BATCHES);
        let mut i = 0u64;
        for _ in 0..HANDOFF_BATCHES {
            let start = Instant::now();
            let mut n = 0u64;
            while n % 64 != 0 || start.elapsed() < HANDOFF_BATCH {
                i += 1;
                // SAFETY: the responder read message `i - 1` before it published its answer,
                // which this thread saw; it reads the buffer again only after `fwd.seq` moves.
                unsafe { std::ptr::copy_nonoverlapping(black_box(&msg[..]).as_ptr(), fwd.buf, size) };
                fwd.seq.0.store(i, Ordering::Release);
                while back.seq.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                // SAFETY: the reply to `i` was published (Acquire above); the responder writes
                // the buffer again only after the next message.
                black_box(&mut reply[..]).copy_from_slice(unsafe { std::slice::from_raw_parts(back.buf, size) });
                n += 1;
            }
            batches.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        fwd.seq.0.store(STOP, Ordering::Release);
        batches
    });
    let batches = initiator.join().unwrap_or_default();
    let _ = responder.join();
    // The threads are gone: nothing points into the buffers any more.
    drop((fwd_mem, back_mem));
    batches
}

/// Round trips the tasks' ping-pong times (the median of all is reported), and its bound in
/// time, as the ping-pong's: 100 000 take 15-20 ms on the development VM.
const TASK_ROUND_TRIPS: usize = 100_000;
const TASK_MAX: Duration = Duration::from_millis(500);
/// The message of the tasks' ping-pong: the size of the README's rr row.
const TASK_MSG: usize = 14;

/// One direction of [`Mailbox`]: a message in one cache line, published by its number.
#[repr(align(128))]
struct Slot {
    /// Messages published (Release by the writer after the words below, Acquire by the reader
    /// before it reads them).
    seq: AtomicU64,
    len: AtomicU64,
    /// The message, 48 bytes at most, as words (each side reads and writes them atomically:
    /// the other may write the next message once it has seen this one's answer, never before).
    words: [AtomicU64; 6],
}

impl Slot {
    fn new() -> Slot {
        Slot { seq: AtomicU64::new(0), len: AtomicU64::new(0), words: Default::default() }
    }
}

/// One end of a stream between two tasks that carries each write (48 bytes at most) in a cache
/// line: a write publishes it; a read spins until the other end's line holds a message it has
/// not read, or until `stop` (then it reads the end of the stream). It never returns `Pending`,
/// so it is only for a task alone on its runtime's thread, as here.
struct Mailbox {
    tx: Arc<Slot>,
    rx: Arc<Slot>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: u64,
    read: u64,
}

impl tokio::io::AsyncRead for Mailbox {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        loop {
            if self.rx.seq.load(Ordering::Acquire) != self.read {
                break;
            }
            if self.stop.load(Ordering::Relaxed) {
                return std::task::Poll::Ready(Ok(()));
            }
            std::hint::spin_loop();
        }
        self.read += 1;
        let mut msg = [0u8; 48];
        for (i, w) in self.rx.words.iter().enumerate() {
            msg[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        let len = (self.rx.len.load(Ordering::Relaxed) as usize).min(msg.len()).min(buf.remaining());
        buf.put_slice(&msg[..len]);
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Mailbox {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = data.len().min(48);
        let mut msg = [0u8; 48];
        msg[..n].copy_from_slice(&data[..n]);
        for (i, w) in self.tx.words.iter().enumerate() {
            let word = u64::from_ne_bytes(msg[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            w.store(word, Ordering::Relaxed);
        }
        self.tx.len.store(n as u64, Ordering::Relaxed);
        self.sent += 1;
        self.tx.seq.store(self.sent, Ordering::Release);
        std::task::Poll::Ready(Ok(n))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// The median round trip between two tasks (see [`Limits::task_rt_us`]). The initiator times
/// each round trip as `smcperf`'s rr client does: a clock read before its `write_all`, and the
/// time elapsed after its `read_exact`.
fn task_pingpong(pin: bool) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = (Arc::new(Slot::new()), Arc::new(Slot::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut responder_end = Mailbox { tx: b.clone(), rx: a.clone(), stop: stop.clone(), sent: 0, read: 0 };
    let mut initiator_end = Mailbox { tx: a, rx: b, stop: stop.clone(), sent: 0, read: 0 };
    let on_runtime = |cpu: usize, f: std::pin::Pin<Box<dyn std::future::Future<Output = f64> + Send>>| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            if pin {
                super::pin_to(cpu);
            }
            let r = match tokio::runtime::Builder::new_current_thread().build() {
                // On a task, as the rr rows' ends are.
                Ok(rt) => rt.block_on(async move { tokio::spawn(f).await.unwrap_or(0.0) }),
                Err(_) => 0.0,
            };
            // Either side gone (done, failed or panicked) ends the other's spin: its reads
            // see the end of the stream.
            stop.store(true, Ordering::Relaxed);
            r
        })
    };
    let responder = on_runtime(
        1,
        Box::pin(async move {
            let mut buf = [0u8; TASK_MSG];
            while responder_end.read_exact(&mut buf).await.is_ok() {
                if responder_end.write_all(&buf).await.is_err() {
                    break;
                }
            }
            0.0
        }),
    );
    let initiator = on_runtime(
        0,
        Box::pin(async move {
            let (msg, mut back) = ([0x5au8; TASK_MSG], [0u8; TASK_MSG]);
            let mut lat = Vec::with_capacity(TASK_ROUND_TRIPS);
            let start = Instant::now();
            while lat.len() < TASK_ROUND_TRIPS && (lat.len() % 256 != 0 || start.elapsed() < TASK_MAX) {
                let t = Instant::now();
                if initiator_end.write_all(&msg).await.is_err() || initiator_end.read_exact(&mut back).await.is_err() {
                    break;
                }
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
            if lat.is_empty() {
                0.0
            } else {
                median(lat)
            }
        }),
    );
    let us = initiator.join().unwrap_or(0.0);
    let _ = responder.join();
    us
}

/// The median over batches of one CPU's copy rate, `size` bytes per copy.
fn memcpy(size: usize) -> f64 {
    let src = PageBuf::new(size, 0x5a);
    let mut dst = PageBuf::new(size, 0);
    // Touch both once so page faults are not timed.
    dst.copy_from_slice(&src);
    let mut batches = Vec::with_capacity(MEMCPY_BATCHES);
    for _ in 0..MEMCPY_BATCHES {
        let start = Instant::now();
        let mut copies = 0u64;
        while start.elapsed() < MEMCPY_BATCH {
            black_box(&mut dst).copy_from_slice(black_box(&src));
            copies += 1;
        }
        batches.push(copies as f64 * size as f64 / start.elapsed().as_secs_f64());
    }
    black_box(&dst);
    median(batches)
}

impl Limits {
    /// One line for the table's header.
    /// The better of two measures, figure by figure: the shorter round trip, the faster copies
    /// and ring (a figure left out, 0, stays out).
    pub(crate) fn best(self, other: Limits) -> Limits {
        let shorter = |a: f64, b: f64| if a > 0.0 && b > 0.0 { a.min(b) } else { 0.0 };
        Limits {
            pingpong_us: shorter(self.pingpong_us, other.pingpong_us),
            task_rt_us: shorter(self.task_rt_us, other.task_rt_us),
            memcpy_64k: self.memcpy_64k.max(other.memcpy_64k),
            memcpy_16m: self.memcpy_16m.max(other.memcpy_16m),
            ring_64k: self.ring_64k.max(other.ring_64k),
        }
    }

    pub(crate) fn describe(&self) -> String {
        let pingpong = if self.pingpong_us > 0.0 {
            format!("atomic ping-pong round trip {:.2} us", self.pingpong_us)
        } else {
            "no atomic ping-pong (one cpu)".to_string()
        };
        let task = if self.task_rt_us > 0.0 {
            format!(", a 14 B round trip between two tokio tasks over one cache line {:.2} us", self.task_rt_us)
        } else {
            String::new()
        };
        format!(
            "machine (same run, the better of a measure before the cases and one after): {pingpong}{task}, memcpy on one cpu {:.1} GB/s (64 KiB), {:.1} GB/s (16 MiB), \
             a 1 MiB ring between two cpus (64 KiB copied in, copied out) {:.1} GB/s",
            self.memcpy_64k / 1e9,
            self.memcpy_16m / 1e9,
            self.ring_64k / 1e9
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_are_measured_not_made_up() {
        let l = measure(false);
        // A round trip takes some time and far less than a scheduler tick per hop; a copy moves
        // bytes at some finite rate. (No bound on speed: this is not a timing test.)
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(l.pingpong_us.is_finite() && (l.pingpong_us > 0.0) == (cpus >= 2), "{l:?}");
        assert!(l.task_rt_us.is_finite() && (l.task_rt_us > 0.0) == (cpus >= 2), "{l:?}");
        assert!(l.memcpy_64k > 0.0 && l.memcpy_64k.is_finite(), "{l:?}");
        assert!(l.memcpy_16m > 0.0 && l.memcpy_16m.is_finite(), "{l:?}");
        assert!(l.ring_64k.is_finite() && (l.ring_64k > 0.0) == (cpus >= 2), "{l:?}");
    }

    #[test]
    fn the_handoff_is_measured_in_batches_of_round_trips() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for size in [14, 1024, 100_000] {
            let b = handoff(size, false);
            assert_eq!(b.len(), if cpus >= 2 { HANDOFF_BATCHES } else { 0 }, "{size}: {b:?}");
            assert!(b.iter().all(|us| us.is_finite() && *us > 0.0), "{size}: {b:?}");
        }
        assert!(handoff(0, false).is_empty());
    }

    #[test]
    fn steal_is_the_eighth_value_of_the_cpu_line() {
        let line = "cpu  2878407 22875 527677 11036836 16559 0 51498 359948 0 0";
        let (steal, total) = parse_cpu_ticks(line).expect("a cpu line");
        assert_eq!(steal, 359948);
        assert_eq!(total, 2878407 + 22875 + 527677 + 11036836 + 16559 + 51498 + 359948);
        assert_eq!(parse_cpu_ticks("cpu0 1 2 3 4 5 6 7 8 0 0"), None, "one CPU's line is not the machine's");
        assert_eq!(parse_cpu_ticks("cpu 1 2 3 x 5 6 7 8"), None);
        assert_eq!(parse_cpu_ticks("cpu 1 2 3 4 5 6 7"), None, "a kernel without steal time");
        assert_eq!(steal_percent(Some((10, 100)), Some((35, 200))), 25.0);
        assert_eq!(steal_percent(None, Some((35, 200))), 0.0);
        assert_eq!(steal_percent(Some((10, 100)), Some((10, 100))), 0.0);
    }

    #[test]
    fn the_better_measure_wins_figure_by_figure() {
        let slow = Limits { pingpong_us: 0.32, task_rt_us: 0.5, memcpy_64k: 30e9, memcpy_16m: 8e9, ring_64k: 1.8e9 };
        let fast = Limits { pingpong_us: 0.07, task_rt_us: 0.13, memcpy_64k: 50e9, memcpy_16m: 7e9, ring_64k: 14e9 };
        let b = slow.best(fast);
        assert_eq!(
            (b.pingpong_us, b.task_rt_us, b.memcpy_64k, b.memcpy_16m, b.ring_64k),
            (0.07, 0.13, 50e9, 8e9, 14e9)
        );
        let b = fast.best(slow);
        assert_eq!(
            (b.pingpong_us, b.task_rt_us, b.memcpy_64k, b.memcpy_16m, b.ring_64k),
            (0.07, 0.13, 50e9, 8e9, 14e9)
        );
        // One CPU: no ping-pong and no ring in either measure, and none made up.
        let one = Limits { pingpong_us: 0.0, task_rt_us: 0.0, memcpy_64k: 30e9, memcpy_16m: 8e9, ring_64k: 0.0 };
        let b = one.best(one);
        assert_eq!((b.pingpong_us, b.task_rt_us, b.ring_64k), (0.0, 0.0, 0.0));
    }
}
