//! The migrations are embedded at compile time (`refinery::embed_migrations!`
//! in `src/migrate.rs`): rebuild when one is added or changed, not only when
//! this crate's own sources change.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
