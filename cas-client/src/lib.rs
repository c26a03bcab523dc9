//! UniCAS client library and the `unicas` command-line tool.
#![forbid(unsafe_code)]

pub mod cli;
