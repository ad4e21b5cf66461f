//! The control surface, on its own address so that faults on the data path
//! never get in the way of healing them: `GET|POST /faults`, `GET /stats`,
//! `GET /healthz`. Every error answer is `{"error": "..."}`.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};

use super::Shared;
use super::faults::Faults;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/faults", web::get().to(get_faults))
        .route("/faults", web::post().to(set_faults))
        .route("/stats", web::get().to(stats))
        .route(
            "/healthz",
            web::get().to(|| async { HttpResponse::Ok().json(serde_json::json!({ "status": "ok" })) }),
        )
        .default_service(web::to(|| async {
            error(StatusCode::NOT_FOUND, "no such endpoint")
        }));
}

fn error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": message }))
}

async fn get_faults(shared: web::Data<Arc<Shared>>) -> HttpResponse {
    HttpResponse::Ok().json(shared.faults())
}

/// Replaces every fault setting: an omitted field goes back to its default.
async fn set_faults(shared: web::Data<Arc<Shared>>, body: web::Bytes) -> HttpResponse {
    let body: &[u8] = if body.is_empty() { b"{}" } else { &body };
    let faults = match serde_json::from_slice::<Faults>(body) {
        Ok(faults) => faults,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid faults: {e}")),
    };
    match shared.set_faults(faults.clone()) {
        Ok(()) => HttpResponse::Ok().json(faults),
        Err(e) => error(StatusCode::BAD_REQUEST, &e),
    }
}

async fn stats(shared: web::Data<Arc<Shared>>) -> HttpResponse {
    HttpResponse::Ok().json(shared.counters.snapshot())
}
