//! svcplane-source
