//! The datagram decoder on untrusted bytes, twice: as they come (almost
//! all stop at the MAC), and sealed behind a valid header and MAC, so the
//! frame parser sees arbitrary frames. Never a panic; and a sealed input
//! that decodes must re-encode to the same bytes (the format is canonical:
//! nothing is accepted that we would not have written).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quire::transport::wire::{
    self, DataFields, DatagramWriter, Echo, Frame, Header, DATAGRAM_BYTES_MAX,
};
use quire::transport::ClusterKey;

fuzz_target!(|data: &[u8]| {
    let key = ClusterKey::from_bytes([7; 32]);
    let _ = wire::decode(&key, data);

    let header = Header {
        sender: 1,
        receiver: 2,
        epoch: 3,
        peer_epoch: 4,
        sent_us: 5,
        echo: Some(Echo {
            sent_us: 6,
            delay_us: 7,
        }),
    };
    let mut sealed = Vec::new();
    drop(DatagramWriter::new(
        &mut sealed,
        &header,
        DATAGRAM_BYTES_MAX,
    ));
    sealed.extend_from_slice(data);
    wire::seal(&key, &mut sealed);
    let Ok(d) = wire::decode(&key, &sealed) else {
        return;
    };
    assert_eq!(d.header, header);
    let mut again = Vec::new();
    let mut w = DatagramWriter::new(&mut again, &header, DATAGRAM_BYTES_MAX);
    for f in &d.frames {
        let fits = match *f {
            Frame::Data {
                group,
                seq,
                rexmit,
                frag_index,
                frag_count,
                payload,
            } => w.data(
                DataFields {
                    group,
                    seq,
                    rexmit,
                    frag_index,
                    frag_count,
                },
                payload,
            ),
            Frame::Ack {
                group,
                probe,
                recv_next,
                send_next,
            } => w.ack(group, probe, recv_next, send_next),
            Frame::Nack { group, ranges } => {
                let r: Vec<(u64, u32)> = ranges.iter().collect();
                w.nack(group, &r)
            }
            Frame::TooOld { group, base } => w.too_old(group, base),
        };
        assert!(fits, "a decoded frame must fit where it came from");
    }
    w.finish(&key);
    assert_eq!(again, sealed, "decode then encode changed the bytes");
});
