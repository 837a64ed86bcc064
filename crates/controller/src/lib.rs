//! svcplane-controller
