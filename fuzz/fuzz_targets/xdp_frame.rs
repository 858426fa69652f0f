//! The AF_XDP frame parser on untrusted bytes, twice: as they come (it
//! must never panic), and as the payload of a frame built from
//! fuzz-chosen addresses, which must parse back to exactly what was
//! built (and still does behind Ethernet padding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::net::xdp::frame::{
    headers_bytes, parse_udp, payload_bytes_max, write_frame, FrameAddrs, Mac,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Takes `N` bytes off the front of `data`, or `None` when too few remain.
fn take<const N: usize>(data: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = data.split_first_chunk::<N>()?;
    *data = rest;
    Some(*head)
}

fn addrs(data: &mut &[u8]) -> Option<FrameAddrs> {
    let [flags] = take::<1>(data)?;
    let src_mac: Mac = take(data)?;
    let dst_mac: Mac = take(data)?;
    let src_port = u16::from_be_bytes(take(data)?);
    let dst_port = u16::from_be_bytes(take(data)?);
    let (src, dst): (IpAddr, IpAddr) = if flags & 1 == 0 {
        (
            Ipv4Addr::from(take::<4>(data)?).into(),
            Ipv4Addr::from(take::<4>(data)?).into(),
        )
    } else {
        (
            Ipv6Addr::from(take::<16>(data)?).into(),
            Ipv6Addr::from(take::<16>(data)?).into(),
        )
    };
    Some(FrameAddrs {
        src_mac,
        dst_mac,
        src: SocketAddr::new(src, src_port),
        dst: SocketAddr::new(dst, dst_port),
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_udp(data);

    let mut rest = data;
    let Some(addrs) = addrs(&mut rest) else {
        return;
    };
    let payload = &rest[..rest.len().min(payload_bytes_max(&addrs.src.ip()))];
    let mut buf = vec![0u8; headers_bytes(&addrs.src.ip()) + payload.len() + 64];
    let len = write_frame(&mut buf, &addrs, payload).expect("sized to fit");
    for frame in [&buf[..len], &buf[..]] {
        let parsed = parse_udp(frame).expect("a built frame parses");
        assert_eq!(parsed.src_mac, addrs.src_mac);
        assert_eq!(parsed.dst_mac, addrs.dst_mac);
        assert_eq!(parsed.src, addrs.src);
        assert_eq!(parsed.dst, addrs.dst);
        assert_eq!(parsed.payload, payload);
    }
    for cut in [0, len / 2, len - 1] {
        assert!(parse_udp(&buf[..cut]).is_err(), "truncated frame accepted");
    }
});
