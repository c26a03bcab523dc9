//! UniCAS client library and the `unicas` command-line tool.
//!
//! - [`AppCasClient`]: the data plane for one App and many Spaces, with retries of transient
//!   failures, cancellation and an optional bounded cache of immutable nodes.
//! - [`capability`]: where tokens come from (a fixed token, or an App signing key that mints
//!   short-lived capabilities).
#![forbid(unsafe_code)]

mod batch;
mod batch_lease;
pub mod capability;
pub mod chunking;
pub mod cli;
mod client;
pub mod dag;
mod error;
pub mod files;
mod similar;
pub mod spool_tree;
mod store;
pub mod tarball;
pub mod transfer;
pub mod tree;
pub mod tree_check;
mod tree_edit;
mod tree_plan;

pub use capability::{CapabilityProvider, FixedToken, SigningKey};
pub use client::{AppCasClient, MAX_NODE_BYTES, RetryPolicy};
pub use dag::{DagReport, Plan, Uploader};
pub use error::ClientError;
pub use files::FileRef;
pub use similar::pair_chunks;
pub use spool_tree::TreeBuilder;
pub use store::{EnsureReport, Ensured};
pub use transfer::{ExportReport, ImportReport};
pub use tree::{Change, Entry, PathError, TreeStats, WalkedEntry, parse_path};
pub use tree_check::{ArchiveTreeCheck, TreeLimits, TreeSummary, TreeWalk};
