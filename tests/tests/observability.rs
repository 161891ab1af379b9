//! What the crate logs about a connection: a span per SMC connection naming its peer and
//! transport, the connection's own events inside it, and a link-group failure that takes
//! connections with it at warn with their count. A small collecting subscriber stands in for
//! `tracing-subscriber`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use smc_tokio::{SmcStream, Transport};
use tests::bounded;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

#[derive(Debug, Clone)]
struct SpanRec {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Debug, Clone)]
struct EventRec {
    level: Level,
    parent: Option<u64>,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Collector {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, SpanRec>>,
    events: Mutex<Vec<EventRec>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl Subscriber for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, a: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = HashMap::new();
        a.record(&mut Fields(&mut fields));
        self.spans.lock().unwrap().insert(id, SpanRec { name: a.metadata().name(), fields });
        Id::from_u64(id)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        if let Some(s) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut s.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut fields = HashMap::new();
        e.record(&mut Fields(&mut fields));
        let parent = e.parent().map(Id::into_u64);
        self.events.lock().unwrap().push(EventRec { level: *e.metadata().level(), parent, fields });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn collector() -> &'static Collector {
    static C: OnceLock<&'static Collector> = OnceLock::new();
    C.get_or_init(|| {
        let c: &'static Collector = Box::leak(Box::default());
        tracing::subscriber::set_global_default(CollectorRef(c)).expect("the only subscriber of this test binary");
        c
    })
}

/// A `Subscriber` handle to the leaked collector.
struct CollectorRef(&'static Collector);

impl Subscriber for CollectorRef {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.0.enabled(m)
    }
    fn new_span(&self, a: &Attributes<'_>) -> Id {
        self.0.new_span(a)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        self.0.record(id, values)
    }
    fn record_follows_from(&self, a: &Id, b: &Id) {
        self.0.record_follows_from(a, b)
    }
    fn event(&self, e: &Event<'_>) {
        self.0.event(e)
    }
    fn enter(&self, id: &Id) {
        self.0.enter(id)
    }
    fn exit(&self, id: &Id) {
        self.0.exit(id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_has_a_span_and_a_group_failure_is_a_warning_with_its_count() {
    let c = collector();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"))
        .arg("serve")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port: u16 = bounded(10, lines.next_line()).await.unwrap().unwrap()[5..].parse().unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut s = bounded(10, SmcStream::connect(addr)).await.unwrap();
    assert_eq!(s.transport(), Transport::SmcD);
    s.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    bounded(10, s.read_exact(&mut b)).await.unwrap();

    // The connection's span names its peer and transport.
    let conn_span = {
        let spans = c.spans.lock().unwrap();
        let found: Vec<_> = spans
            .iter()
            .filter(|(_, s)| s.name == "smc_conn" && s.fields.get("peer").is_some_and(|p| *p == addr.to_string()))
            .map(|(id, s)| (*id, s.clone()))
            .collect();
        assert_eq!(found.len(), 1, "one smc_conn span for {addr}: {spans:?}");
        let (id, span) = &found[0];
        assert_eq!(span.fields.get("transport").map(String::as_str), Some("smc-d"), "{span:?}");
        *id
    };

    // The peer dies: the group fails with this connection on it.
    child.start_kill().unwrap();
    let _ = child.wait().await;
    let mut rest = Vec::new();
    let _ = bounded(10, s.read_to_end(&mut rest)).await;
    // The reader can learn of the end (its TCP socket's reset, or the failure marking it ended)
    // just before the driver logs the failure: wait for the events, up to a bound.
    let warned_with_count = |events: &[EventRec]| {
        events.iter().any(|e| {
            e.level == Level::WARN
                && e.fields.get("message").is_some_and(|m| m.contains("link group failed"))
                && e.fields.get("conns").map(String::as_str) == Some("1")
        })
    };
    let in_conn_span = |events: &[EventRec]| {
        events.iter().any(|e| {
            e.parent == Some(conn_span)
                && e.fields.get("message").is_some_and(|m| m.contains("link group failed under the connection"))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let events = loop {
        let events = c.events.lock().unwrap().clone();
        if (warned_with_count(&events) && in_conn_span(&events)) || std::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let warned: Vec<_> = events
        .iter()
        .filter(|e| e.level == Level::WARN && e.fields.get("message").is_some_and(|m| m.contains("link group failed")))
        .collect();
    assert!(warned_with_count(&events), "a warning with the connection count: {warned:?}");
    // And the connection heard of it in its own span.
    assert!(in_conn_span(&events), "an event in the connection's span");
}
