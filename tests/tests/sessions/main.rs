//! Sessions end to end, on real marimo processes: a notebook opened through the hub runs in
//! marimo, is edited through the hub's proxy the way marimo's editor edits it (its page, its
//! WebSocket, its save API), and what it changed becomes revisions of the workspace; the
//! teardown's rendered HTML becomes a snapshot of the version it cuts. Editors are claimed
//! and taken over; silent sessions expire; a killed or stopped hub loses no change and leaves
//! no process behind.

mod access;
mod crash;
mod editors;
mod lifecycle;
mod pools;
