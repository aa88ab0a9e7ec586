//! `POST /emulator/faults`: fault injection for tests that run the emulator as a process.
//!
//! Body: `{"action":"fail"|"delay"|"drop-watches"|"clear","verb":..,"resource":..,"count":..,
//! "code":..,"delayMs":..}`; the answer is `{"ok":true}` (plus `"dropped":N` for drop-watches).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use super::{error_response, json_response};
use crate::emulator::Shared;
use crate::status::ApiError;

pub(crate) async fn handle(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "invalid fault request: {e}"
            )));
        }
    };
    let s = |k: &str, d: &'static str| req.get(k).and_then(Value::as_str).unwrap_or(d).to_string();
    let n = |k: &str, d: u64| req.get(k).and_then(Value::as_u64).unwrap_or(d);
    let faults = &shared.faults;
    let count = usize::try_from(n("count", 1)).unwrap_or(usize::MAX);
    match s("action", "").as_str() {
        "fail" => {
            let code = u16::try_from(n("code", 500)).unwrap_or(500);
            faults.fail_next(&s("verb", "*"), &s("resource", "*"), count, code);
            json_response(200, &json!({"ok": true}), &[])
        }
        "delay" => {
            faults.delay_next(
                &s("verb", "*"),
                &s("resource", "*"),
                count,
                Duration::from_millis(n("delayMs", 0)),
            );
            json_response(200, &json!({"ok": true}), &[])
        }
        "drop-watches" => {
            let dropped = faults.drop_watches(&s("resource", "*"));
            json_response(200, &json!({"ok": true, "dropped": dropped}), &[])
        }
        "clear" => {
            faults.clear();
            json_response(200, &json!({"ok": true}), &[])
        }
        other => error_response(&ApiError::bad_request(format!(
            "unknown action \"{other}\": expected fail, delay, drop-watches or clear"
        ))),
    }
}
