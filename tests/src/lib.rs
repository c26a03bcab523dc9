//! End-to-end tests of UniCAS: they start real servers and drive them through the client and plain HTTP.
