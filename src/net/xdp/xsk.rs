//! One AF_XDP socket with its own UMEM: the frame memory shared with the
//! kernel and the four single-producer single-consumer rings (fill and
//! completion for the UMEM, rx and tx for the socket).
//!
//! The UMEM is cut into `frames` chunks of `frame_bytes`; the first half
//! is lent to the kernel for receiving (through the fill ring, and given
//! back after each received frame is read), the second half is this
//! side's to send from (a free list, refilled from the completion ring).
//! Frames are never shared between the halves, so a received frame can be
//! read in place while frames are being sent.
//!
//! Ring protocol (linux/if_xdp.h, Documentation/networking/af_xdp.rst):
//! each ring has a producer and a consumer index in shared memory; the
//! producer writes descriptors then publishes the index with a release
//! store, the consumer reads the index with an acquire load. Indices are
//! free-running u32s, masked by the (power of two) ring size.

use super::bpf;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// `sendto` calls one [`Xsk::kick`] makes at most: a whole ring of 2048
/// frames in the kernel's batches of 32, with room to spare.
const KICKS_PER_CALL_MAX: usize = 128;

/// What [`Xsk::send`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// On the tx ring.
    Queued,
    /// No free frame or tx slot.
    Full,
    /// The filler wrote no frame.
    Refused,
}

/// How the socket was bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The NIC's driver DMAs straight into the UMEM.
    ZeroCopy,
    /// The kernel copies between its buffers and the UMEM.
    Copy,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::ZeroCopy => "zero-copy",
            Mode::Copy => "copy",
        })
    }
}

/// Sizes of a socket's UMEM and rings.
#[derive(Clone, Copy, Debug)]
pub struct XskSizes {
    /// UMEM frames (a power of two): half receive, half send.
    pub frames: u32,
    /// Bytes per frame: 2048 or 4096 (the kernel's aligned chunk sizes).
    pub frame_bytes: u32,
}

impl XskSizes {
    /// Entries of each ring: one per frame of its half.
    fn ring_entries(&self) -> u32 {
        self.frames / 2
    }
    /// UMEM bytes.
    pub fn umem_bytes(&self) -> usize {
        self.frames as usize * self.frame_bytes as usize
    }
}

/// One mapped ring.
struct Ring {
    map: NonNull<u8>,
    map_bytes: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
    /// This side's copy of its own index (producer or consumer).
    local: u32,
}

impl Ring {
    /// Maps ring `pgoff` of `fd` with `entries` descriptors of `desc_bytes`.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        pgoff: u64,
        entries: u32,
        desc_bytes: usize,
    ) -> io::Result<Ring> {
        let map_bytes = off.desc as usize + entries as usize * desc_bytes;
        // SAFETY: a fresh shared mapping of the socket's ring; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mapping an AF_XDP ring: {e}"),
            ));
        }
        let base = p as *mut u8;
        // SAFETY: the offsets come from the kernel and lie inside the map.
        unsafe {
            Ok(Ring {
                map: NonNull::new(base).expect("mmap returned non-null"),
                map_bytes,
                producer: base.add(off.producer as usize) as *const AtomicU32,
                consumer: base.add(off.consumer as usize) as *const AtomicU32,
                flags: base.add(off.flags as usize) as *const AtomicU32,
                desc: base.add(off.desc as usize),
                mask: entries - 1,
                local: 0,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping, aligned by the kernel.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: slots free to fill.
    fn free(&self) -> u32 {
        let cons = self.consumer().load(Ordering::Acquire);
        (self.mask + 1) - self.local.wrapping_sub(cons)
    }
    /// Consumer side: descriptors ready to read.
    fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }
    fn slot(&self, i: u32, desc_bytes: usize) -> *mut u8 {
        // SAFETY: masked index inside the descriptor array.
        unsafe { self.desc.add((i & self.mask) as usize * desc_bytes) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe {
            libc::munmap(self.map.as_ptr() as *mut libc::c_void, self.map_bytes);
        }
    }
}

/// Counters of one socket.
#[derive(Clone, Copy, Debug, Default)]
pub struct XskStats {
    /// Frames read from the rx ring.
    pub rx_frames: u64,
    /// Frames put on the tx ring.
    pub tx_frames: u64,
    /// `sendto` kicks to start transmission.
    pub tx_kicks: u64,
    /// Sends refused because no frame or tx slot was free.
    pub tx_ring_full: u64,
    /// Frames the kernel dropped before this side saw them (its
    /// XDP_STATISTICS: rx ring full, fill ring empty, or dropped), as of
    /// the last [`Xsk::kernel_drops`].
    pub rx_kernel_dropped: u64,
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM.
pub struct Xsk {
    fd: OwnedFd,
    umem: NonNull<u8>,
    sizes: XskSizes,
    fill: Ring,
    completion: Ring,
    rx: Ring,
    tx: Ring,
    /// Send frames (UMEM addresses) not in flight.
    free_tx: Vec<u64>,
    /// Received frames read and not yet given back to the fill ring.
    to_refill: Vec<u64>,
    mode: Mode,
    stats: XskStats,
}

// SAFETY: the raw pointers are into mappings this struct owns; only the
// owning thread uses it (it moves with the driver, never shared).
unsafe impl Send for Xsk {}

fn sockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: v is a valid T for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            v as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Xsk {
    /// Opens a socket on `ifindex` queue `queue` with a UMEM of `sizes`:
    /// zero-copy if `zero_copy` and the driver supports it, else copy
    /// mode (the reason zero-copy was refused is returned with it).
    pub fn open(
        ifindex: u32,
        queue: u32,
        sizes: XskSizes,
        zero_copy: bool,
    ) -> io::Result<(Xsk, Option<String>)> {
        if !sizes.frames.is_power_of_two() || sizes.frames < 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} UMEM frames: a power of two, at least 4", sizes.frames),
            ));
        }
        if sizes.frame_bytes != 2048 && sizes.frame_bytes != 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}-byte UMEM frames: 2048 or 4096", sizes.frame_bytes),
            ));
        }
        // One socket and UMEM for both attempts: a second UMEM would be
        // charged to the locked-memory limit while the kernel still holds
        // the first one's charge.
        let mut xsk = Xsk::open_unbound(sizes)?;
        if zero_copy {
            match xsk.bind(ifindex, queue, Mode::ZeroCopy) {
                Ok(()) => return Ok((xsk, None)),
                Err(e) => {
                    let why = format!("zero-copy refused ({e}); copy mode");
                    return match xsk.bind(ifindex, queue, Mode::Copy) {
                        Ok(()) => Ok((xsk, Some(why))),
                        // Some kernels free the rings with a refused
                        // bind: then a fresh socket for copy mode.
                        Err(_) => {
                            drop(xsk);
                            let mut fresh = Xsk::open_unbound(sizes)?;
                            fresh.bind(ifindex, queue, Mode::Copy)?;
                            Ok((fresh, Some(why)))
                        }
                    };
                }
            }
        }
        xsk.bind(ifindex, queue, Mode::Copy)?;
        Ok((xsk, None))
    }

    /// A socket with its UMEM registered, rings mapped and the receive
    /// half on the fill ring, not yet bound.
    fn open_unbound(sizes: XskSizes) -> io::Result<Xsk> {
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::EAFNOSUPPORT) => " (the kernel has no AF_XDP: CONFIG_XDP_SOCKETS)",
                Some(libc::EPERM) => " (needs CAP_NET_RAW, or root)",
                _ => "",
            };
            return Err(io::Error::new(
                e.kind(),
                format!("opening an AF_XDP socket: {e}{hint}"),
            ));
        }
        // SAFETY: just returned by socket(2).
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_bytes = sizes.umem_bytes();
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mapping {umem_bytes} bytes of UMEM: {e}"),
            ));
        }
        let umem = NonNull::new(p as *mut u8).expect("mmap returned non-null");
        // From here on a failure must unmap the UMEM: build the struct
        // around it early would need the rings, so unmap by hand.
        let unmap = |e: io::Error| {
            // SAFETY: our own mapping of umem_bytes.
            unsafe { libc::munmap(umem.as_ptr() as *mut libc::c_void, umem_bytes) };
            e
        };
        // SAFETY: xdp_umem_reg is plain data.
        let mut reg: libc::xdp_umem_reg = unsafe { zeroed() };
        reg.addr = umem.as_ptr() as u64;
        reg.len = umem_bytes as u64;
        reg.chunk_size = sizes.frame_bytes;
        sockopt(fd.as_raw_fd(), libc::XDP_UMEM_REG, &reg).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::ENOBUFS)
                || e.raw_os_error() == Some(libc::ENOMEM)
                || e.raw_os_error() == Some(libc::EPERM)
            {
                " (the UMEM is locked memory: raise `ulimit -l` (LimitMEMLOCK=) or run with CAP_IPC_LOCK)"
            } else {
                ""
            };
            unmap(io::Error::new(
                e.kind(),
                format!("registering {umem_bytes} bytes of UMEM: {e}{hint}"),
            ))
        })?;
        let n = sizes.ring_entries();
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "fill"),
            (libc::XDP_UMEM_COMPLETION_RING, "completion"),
            (libc::XDP_RX_RING, "rx"),
            (libc::XDP_TX_RING, "tx"),
        ] {
            sockopt(fd.as_raw_fd(), opt, &n).map_err(|e| {
                unmap(io::Error::new(
                    e.kind(),
                    format!("sizing the AF_XDP {what} ring to {n}: {e}"),
                ))
            })?;
        }
        // SAFETY: xdp_mmap_offsets is plain data; the kernel fills it.
        let mut off: libc::xdp_mmap_offsets = unsafe { zeroed() };
        let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off and len are valid for writing.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(unmap(io::Error::new(
                e.kind(),
                format!("reading the AF_XDP ring offsets: {e}"),
            )));
        }
        let desc = size_of::<libc::xdp_desc>();
        let rings = (|| {
            Ok::<_, io::Error>((
                Ring::map(
                    fd.as_raw_fd(),
                    &off.fr,
                    libc::XDP_UMEM_PGOFF_FILL_RING,
                    n,
                    8,
                )?,
                Ring::map(
                    fd.as_raw_fd(),
                    &off.cr,
                    libc::XDP_UMEM_PGOFF_COMPLETION_RING,
                    n,
                    8,
                )?,
                Ring::map(
                    fd.as_raw_fd(),
                    &off.rx,
                    libc::XDP_PGOFF_RX_RING as u64,
                    n,
                    desc,
                )?,
                Ring::map(
                    fd.as_raw_fd(),
                    &off.tx,
                    libc::XDP_PGOFF_TX_RING as u64,
                    n,
                    desc,
                )?,
            ))
        })();
        let (fill, completion, rx, tx) = rings.map_err(unmap)?;
        let mut xsk = Xsk {
            fd,
            umem,
            sizes,
            fill,
            completion,
            rx,
            tx,
            free_tx: (n..sizes.frames)
                .map(|i| u64::from(i) * u64::from(sizes.frame_bytes))
                .collect(),
            to_refill: (0..n)
                .map(|i| u64::from(i) * u64::from(sizes.frame_bytes))
                .collect(),
            mode: Mode::Copy,
            stats: XskStats::default(),
        };
        // The receive half goes to the kernel before binding, so the first
        // frames have somewhere to land.
        xsk.refill();
        Ok(xsk)
    }

    /// Binds to `ifindex` queue `queue` in `mode`.
    fn bind(&mut self, ifindex: u32, queue: u32, mode: Mode) -> io::Result<()> {
        // SAFETY: sockaddr_xdp is plain data.
        let mut sa: libc::sockaddr_xdp = unsafe { zeroed() };
        sa.sxdp_family = libc::AF_XDP as u16;
        sa.sxdp_ifindex = ifindex;
        sa.sxdp_queue_id = queue;
        sa.sxdp_flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                Mode::ZeroCopy => libc::XDP_ZEROCOPY,
                Mode::Copy => libc::XDP_COPY,
            };
        // SAFETY: sa is a valid sockaddr_xdp.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("binding the AF_XDP socket to interface {ifindex} queue {queue} in {mode} mode: {e}"),
            ));
        }
        self.mode = mode;
        Ok(())
    }

    /// The socket, to poll (readable: the rx ring has frames) and to put
    /// in the XSKMAP.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// How it was bound.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Counters.
    pub fn stats(&self) -> XskStats {
        self.stats
    }

    /// Reads the kernel's drop counters of this socket (one getsockopt;
    /// for status reads, not the data path) into the stats.
    pub fn kernel_drops(&mut self) -> u64 {
        // SAFETY: xdp_statistics is plain data; the kernel fills it.
        let mut st: libc::xdp_statistics = unsafe { zeroed() };
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: st and len are valid for writing.
        let r = unsafe {
            libc::getsockopt(
                self.fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r == 0 {
            self.stats.rx_kernel_dropped =
                st.rx_dropped + st.rx_ring_full + st.rx_fill_ring_empty_descs;
        }
        self.stats.rx_kernel_dropped
    }

    /// Bytes of a frame.
    pub fn frame_bytes(&self) -> usize {
        self.sizes.frame_bytes as usize
    }

    /// Frames free to send from now (after reaping completions).
    pub fn tx_free(&mut self) -> usize {
        self.reap_completions();
        (self.free_tx.len()).min(self.tx.free() as usize)
    }

    /// Gives read frames back to the kernel for receiving.
    fn refill(&mut self) {
        let room = self.fill.free() as usize;
        let k = room.min(self.to_refill.len());
        if k == 0 {
            return;
        }
        let start = self.fill.local;
        for (j, addr) in self.to_refill.drain(..k).enumerate() {
            // SAFETY: a slot of the fill ring this side owns.
            unsafe { (self.fill.slot(start.wrapping_add(j as u32), 8) as *mut u64).write(addr) };
        }
        self.fill.local = start.wrapping_add(k as u32);
        self.fill
            .producer()
            .store(self.fill.local, Ordering::Release);
    }

    fn reap_completions(&mut self) {
        let k = self.completion.ready();
        if k == 0 {
            return;
        }
        let start = self.completion.local;
        for j in 0..k {
            // SAFETY: a published slot of the completion ring.
            let addr =
                unsafe { (self.completion.slot(start.wrapping_add(j), 8) as *const u64).read() };
            let base = addr & !(u64::from(self.sizes.frame_bytes) - 1);
            // Only frames of the send half come back; anything else (a
            // kernel bug) is not trusted as an offset into the UMEM.
            let send_half = u64::from(self.sizes.ring_entries()) * u64::from(self.sizes.frame_bytes)
                ..self.sizes.umem_bytes() as u64;
            if send_half.contains(&base) {
                self.free_tx.push(base);
            }
        }
        self.completion.local = start.wrapping_add(k);
        self.completion
            .consumer()
            .store(self.completion.local, Ordering::Release);
    }

    /// Reads up to `max` received frames: calls `f` once with all their
    /// bytes (in the UMEM, valid only during the call), then gives the
    /// frames back to the kernel. Returns how many were read.
    pub fn receive(&mut self, max: usize, f: impl FnOnce(&[&[u8]])) -> usize {
        let k = (self.rx.ready() as usize).min(max);
        if k == 0 {
            return 0;
        }
        let start = self.rx.local;
        let desc = size_of::<libc::xdp_desc>();
        let frame = u64::from(self.sizes.frame_bytes);
        let umem_bytes = self.sizes.umem_bytes() as u64;
        let mut frames: Vec<&[u8]> = Vec::with_capacity(k);
        for j in 0..k as u32 {
            // SAFETY: a published slot of the rx ring.
            let d = unsafe {
                (self.rx.slot(start.wrapping_add(j), desc) as *const libc::xdp_desc).read()
            };
            let base = d.addr & !(frame - 1);
            // The kernel gives addresses inside the UMEM; one it did not
            // (a bug we would rather skip than follow) is not read.
            if d.addr + u64::from(d.len) > base + frame || base >= umem_bytes {
                continue;
            }
            self.to_refill.push(base);
            // SAFETY: inside the UMEM (checked above); the frame is this
            // side's until it goes back on the fill ring after `f`.
            frames.push(unsafe {
                std::slice::from_raw_parts(self.umem.as_ptr().add(d.addr as usize), d.len as usize)
            });
        }
        f(&frames);
        drop(frames);
        self.rx.local = start.wrapping_add(k as u32);
        self.rx.consumer().store(self.rx.local, Ordering::Release);
        self.stats.rx_frames += k as u64;
        self.refill();
        if self.fill.needs_wakeup() {
            // The driver sleeps until told the fill ring has frames again.
            // SAFETY: a zero-length non-blocking recvfrom, as libxdp does.
            unsafe {
                libc::recvfrom(
                    self.fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        k
    }

    /// Queues one frame for sending: `fill` writes it into the frame's
    /// bytes (all `frame_bytes` of them) and returns its length, or `None`
    /// to send nothing. Call [`Xsk::kick`] after a batch.
    pub fn send(&mut self, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> Sent {
        if self.free_tx.is_empty() || self.tx.free() == 0 {
            self.reap_completions();
            if self.free_tx.is_empty() || self.tx.free() == 0 {
                self.stats.tx_ring_full += 1;
                return Sent::Full;
            }
        }
        let addr = self.free_tx.pop().expect("checked non-empty");
        // SAFETY: a send-half frame not in flight: only this side uses it.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                self.umem.as_ptr().add(addr as usize),
                self.sizes.frame_bytes as usize,
            )
        };
        let Some(len) = fill(buf).filter(|&n| n > 0) else {
            // Nothing to send: the frame goes back, the ring is untouched.
            self.free_tx.push(addr);
            return Sent::Refused;
        };
        assert!(
            len <= self.sizes.frame_bytes as usize,
            "a frame fits its chunk"
        );
        let desc = libc::xdp_desc {
            addr,
            len: len as u32,
            options: 0,
        };
        let slot = self.tx.local;
        // SAFETY: a free slot of the tx ring (checked above).
        unsafe {
            (self.tx.slot(slot, size_of::<libc::xdp_desc>()) as *mut libc::xdp_desc).write(desc)
        };
        self.tx.local = slot.wrapping_add(1);
        self.tx.producer().store(self.tx.local, Ordering::Release);
        self.stats.tx_frames += 1;
        Sent::Queued
    }

    /// Starts transmission of what was queued. In copy mode the kernel
    /// sends only from within this call, and at most a small batch per
    /// call (32 frames in 6.x), so it repeats while the ring holds frames
    /// the kernel has not taken and each call makes progress; in
    /// zero-copy mode it calls only when the driver asks.
    pub fn kick(&mut self) -> io::Result<()> {
        for _ in 0..KICKS_PER_CALL_MAX {
            let pending = self.tx_pending();
            if pending == 0 || (self.mode == Mode::ZeroCopy && !self.tx.needs_wakeup()) {
                break;
            }
            self.stats.tx_kicks += 1;
            // SAFETY: a zero-length non-blocking sendto on our socket.
            let r = unsafe {
                libc::sendto(
                    self.fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            self.reap_completions();
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // The kernel's batch is spent (EAGAIN after sending
                    // some): go on while it takes frames.
                    Some(libc::EAGAIN) if self.tx_pending() < pending => continue,
                    // Busy or out of buffers: the frames stay on the ring
                    // and go with the next kick.
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) => return Ok(()),
                    _ => return Err(e),
                }
            }
            if self.tx_pending() >= pending {
                break;
            }
        }
        Ok(())
    }

    /// The tx ring's consumer index (moves while the kernel takes frames).
    pub fn tx_consumed(&self) -> u32 {
        self.tx.consumer().load(Ordering::Acquire)
    }

    /// Frames on the tx ring the kernel has not taken yet.
    pub fn tx_pending(&self) -> u32 {
        self.tx
            .local
            .wrapping_sub(self.tx.consumer().load(Ordering::Acquire))
    }

    /// Frames sent and not yet completed.
    pub fn tx_in_flight(&self) -> usize {
        self.sizes.ring_entries() as usize - self.free_tx.len()
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // The rings unmap themselves (fields drop after this); the socket
        // closes after them; the UMEM must outlive the socket's use of it,
        // so it is unmapped here only after closing would be too late to
        // matter: the kernel holds its own page references for the UMEM.
        // SAFETY: our own mapping, unmapped once.
        unsafe {
            libc::munmap(
                self.umem.as_ptr() as *mut libc::c_void,
                self.sizes.umem_bytes(),
            )
        };
    }
}

/// Opens a socket on `ifindex` queue `queue` and puts it in `xskmap`.
pub fn open_in_map(
    ifindex: u32,
    queue: u32,
    sizes: XskSizes,
    zero_copy: bool,
    xskmap: RawFd,
) -> io::Result<(Xsk, Option<String>)> {
    let (xsk, why) = Xsk::open(ifindex, queue, sizes, zero_copy)?;
    bpf::xskmap_insert(xskmap, queue, xsk.fd())?;
    Ok((xsk, why))
}
