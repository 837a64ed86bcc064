//! svcplane-backend-nftables
