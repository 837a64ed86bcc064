//! svcplane-nft
