//! What every handler reaches: the pool, the open sessions, the settings.

use crate::auth::Sessions;
use crate::config::Console;

pub struct State {
    pub pool: db::Pool,
    pub sessions: Sessions,
    pub console: Console,
}
