//! Hostile input and hostile users, end to end. Each module reproduces one class of attack
//! against real server processes and checks that it is refused with a clear 4xx in its API's
//! envelope, that nothing is written outside the data and spool directories (by listing a
//! directory the test owns), that nothing is stored or root-referenced, that other users are
//! unaffected, and, where the attack is about memory, that the process stays under its stated
//! bound (see `docs/security.md`).

mod admin_sign_in;
mod browser;
mod catalog_quota;
mod depth;
mod disk;
mod import_metadata;
mod links;
mod memory;
mod support;
mod sync_tokens;
mod tokens;
mod upload_urls;
