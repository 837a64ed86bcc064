//! svcplane-testbed
