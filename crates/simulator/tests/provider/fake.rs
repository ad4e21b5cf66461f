//! A fake ingest on loopback: verifies signatures with `signature::Verifier`,
//! deduplicates by event id, answers as the real ingest does (status,
//! byte-identical replays with `Idempotent-Replayed: true`), and misbehaves
//! on request: slow or 503 for the first deliveries, one status for all, or
//! holding each delivery until a given number of the same event is in.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use signature::{Scheme, Verifier};
use tokio::sync::Notify;

#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// The first `slow_first` deliveries (of any event) are answered only
    /// after `slow_for`, processed normally.
    pub slow_first: usize,
    pub slow_for: Duration,
    /// The first `unavailable_first` deliveries get 503 with
    /// `Retry-After: retry_after_secs`, and nothing is recorded.
    pub unavailable_first: usize,
    pub retry_after_secs: u64,
    /// Every delivery gets this status, and nothing is recorded.
    pub always: Option<u16>,
    /// Each delivery waits (at most 5 s) until this many deliveries of its
    /// event have arrived: only concurrent deliveries all pass quickly.
    pub gather: Option<usize>,
}

/// One request, as it arrived and as it was answered.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event_id: Option<String>,
    pub webhook_id: Option<String>,
    pub verified: bool,
    pub at: Instant,
    /// 0 until answered.
    pub status: u16,
    pub replayed: bool,
    /// Deliveries of the same event in progress when this one arrived (itself included).
    pub in_flight: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Pending,
    Paid,
    Refunded,
}

#[derive(Default)]
struct Book {
    deliveries: Vec<Delivery>,
    /// Event id to the stored answer body and status.
    events: HashMap<String, (String, String)>,
    orders: HashMap<String, Order>,
    in_flight: HashMap<String, usize>,
    arrivals: HashMap<String, usize>,
    in_flight_total: usize,
    max_in_flight_total: usize,
}

pub struct State {
    verifier: Verifier,
    behaviour: Mutex<Behaviour>,
    book: Mutex<Book>,
    arrived: Notify,
}

impl State {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap()
    }
}

pub struct FakeIngest {
    /// `http://127.0.0.1:PORT` (the provider appends the path).
    pub url: String,
    state: web::Data<State>,
    handle: ServerHandle,
}

impl FakeIngest {
    /// Orders `pay_1 .. pay_<orders>`, all pending.
    pub async fn start(scheme: Scheme, secret: &str, orders: u64, behaviour: Behaviour) -> Self {
        let verifier = Verifier::new(scheme, secret, signature::DEFAULT_TOLERANCE_SECS).unwrap();
        let book = Book {
            orders: (1..=orders)
                .map(|n| (format!("pay_{n}"), Order::Pending))
                .collect(),
            ..Book::default()
        };
        let state = web::Data::new(State {
            verifier,
            behaviour: Mutex::new(behaviour),
            book: Mutex::new(book),
            arrived: Notify::new(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app_state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(app_state.clone())
                .route("/webhooks/payments", web::post().to(receive))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { url, state, handle }
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state.book().deliveries.clone()
    }

    /// Deliveries of `event_id`, in arrival order.
    pub fn deliveries_of(&self, event_id: &str) -> Vec<Delivery> {
        let book = self.state.book();
        let of = |d: &&Delivery| d.event_id.as_deref() == Some(event_id);
        book.deliveries.iter().filter(of).cloned().collect()
    }

    /// Events recorded (processed once each), with their status.
    pub fn recorded(&self) -> HashMap<String, String> {
        let book = self.state.book();
        book.events
            .iter()
            .map(|(id, (_, status))| (id.clone(), status.clone()))
            .collect()
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.book().max_in_flight_total
    }
}

impl Drop for FakeIngest {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn receive(state: web::Data<State>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let verified = state
        .verifier
        .verify(
            |name| req.headers().get(name).map(|v| v.as_bytes()),
            &body,
            unix_now(),
        )
        .is_ok();
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    let event_id = parsed.as_ref().and_then(|p| text(&p["id"]));
    let webhook_id = req
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let behaviour = state.behaviour.lock().unwrap().clone();

    let index = {
        let mut book = state.book();
        let in_flight = match &event_id {
            Some(id) => {
                *book.arrivals.entry(id.clone()).or_default() += 1;
                let n = book.in_flight.entry(id.clone()).or_default();
                *n += 1;
                *n
            }
            None => 0,
        };
        book.in_flight_total += 1;
        book.max_in_flight_total = book.max_in_flight_total.max(book.in_flight_total);
        book.deliveries.push(Delivery {
            event_id: event_id.clone(),
            webhook_id,
            verified,
            at: Instant::now(),
            status: 0,
            replayed: false,
            in_flight,
        });
        book.deliveries.len() - 1
    };
    state.arrived.notify_waiters();

    let response = answer(
        &state,
        &behaviour,
        index,
        verified,
        parsed.as_ref(),
        event_id.as_deref(),
    )
    .await;

    let mut book = state.book();
    book.in_flight_total -= 1;
    if let Some(id) = &event_id {
        *book.in_flight.get_mut(id).unwrap() -= 1;
    }
    let delivery = &mut book.deliveries[index];
    delivery.status = response.status().as_u16();
    delivery.replayed = response.headers().contains_key("idempotent-replayed");
    response
}

async fn answer(
    state: &State,
    behaviour: &Behaviour,
    index: usize,
    verified: bool,
    event: Option<&serde_json::Value>,
    event_id: Option<&str>,
) -> HttpResponse {
    if !verified {
        return HttpResponse::Unauthorized().json(serde_json::json!({"error": "no signature matches"}));
    }
    let (Some(event), Some(id)) = (event, event_id) else {
        return HttpResponse::BadRequest().json(serde_json::json!({"error": "not an event"}));
    };
    if let Some(status) = behaviour.always {
        return HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).finish();
    }
    if index < behaviour.unavailable_first {
        return HttpResponse::ServiceUnavailable()
            .insert_header(("Retry-After", behaviour.retry_after_secs.to_string()))
            .json(serde_json::json!({"error": "database unavailable"}));
    }
    if index < behaviour.slow_first {
        tokio::time::sleep(behaviour.slow_for).await;
    }
    if let Some(n) = behaviour.gather {
        gather(state, id, n).await;
    }

    let mut book = state.book();
    if let Some((body, _)) = book.events.get(id) {
        return HttpResponse::Ok()
            .content_type("application/json")
            .insert_header(("Idempotent-Replayed", "true"))
            .body(body.clone());
    }
    let payment_id = event["data"]["payment_id"].as_str().unwrap_or("");
    let status = match (event["type"].as_str(), book.orders.get(payment_id).copied()) {
        (Some("payment.succeeded"), Some(Order::Pending)) => {
            book.orders.insert(payment_id.to_owned(), Order::Paid);
            "processed"
        }
        (Some("payment.succeeded"), Some(Order::Paid)) => "already_paid",
        (Some("payment.succeeded"), Some(Order::Refunded)) => "order_refunded",
        (Some("payment.refunded"), Some(_)) => {
            book.orders.insert(payment_id.to_owned(), Order::Refunded);
            "refunded"
        }
        (Some("payment.succeeded" | "payment.refunded"), None) => "unmatched",
        _ => "ignored",
    };
    let body = serde_json::json!({"event_id": id, "status": status}).to_string();
    book.events
        .insert(id.to_owned(), (body.clone(), status.to_owned()));
    HttpResponse::Ok().content_type("application/json").body(body)
}

/// Waits until `n` deliveries of `id` have arrived, or 5 s.
async fn gather(state: &State, id: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        // Registered before the check, so an arrival in between is not missed.
        let notified = state.arrived.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if state.book().arrivals.get(id).copied().unwrap_or(0) >= n {
            return;
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return;
        }
    }
}

/// An address that refuses connections: bound, then released.
pub fn dead_target() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// An address that accepts connections (into the backlog) and never answers.
pub fn silent_target() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}
