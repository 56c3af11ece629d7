//! Session and client-record operations (RFC 8881 §18.34–§18.37, §18.46,
//! §18.50, §18.51).

use crate::compound::{Compound, Seq, Step};
use crate::error::{fail, OpResult};
use crate::state::{ChannelAttrs, RPC_CALL_HEADER_BYTES_MIN, RPC_REPLY_HEADER_BYTES};
use proto::nfs4 as p;
use rpc::backchannel::CallCred;
use proto::xdr::{Decoder, Encoder, Xdr};

/// Encoded size of CREATE_SESSION4resok (no RDMA attributes): checked
/// before the session is made, so a reply that cannot be sent creates none.
const CREATE_SESSION_RES_BYTES: usize = 16 + 4 + 4 + 2 * (6 * 4 + 4);

/// Flags a client may set in eia_flags (§18.35.3); anything else, e.g. the
/// server-only CONFIRMED_R, is NFS4ERR_INVAL.
const EIA_FLAGS_ALLOWED: u32 = p::EXCHGID4_FLAG_SUPP_MOVED_REFER
    | p::EXCHGID4_FLAG_SUPP_MOVED_MIGR
    | p::EXCHGID4_FLAG_BIND_PRINC_STATEID
    | p::EXCHGID4_FLAG_MASK_PNFS
    | p::EXCHGID4_FLAG_UPD_CONFIRMED_REC_A;

fn attrs_in(a: &p::channel_attrs4) -> ChannelAttrs {
    ChannelAttrs {
        headerpad_bytes: a.ca_headerpadsize,
        request_bytes_max: a.ca_maxrequestsize,
        response_bytes_max: a.ca_maxresponsesize,
        response_cached_bytes_max: a.ca_maxresponsesize_cached,
        ops_max: a.ca_maxoperations,
        requests_max: a.ca_maxrequests,
    }
}

fn attrs_out(a: &ChannelAttrs) -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: a.headerpad_bytes,
        ca_maxrequestsize: a.request_bytes_max,
        ca_maxresponsesize: a.response_bytes_max,
        ca_maxresponsesize_cached: a.response_cached_bytes_max,
        ca_maxoperations: a.ops_max,
        ca_maxrequests: a.requests_max,
        ca_rdma_ird: Vec::new(),
    }
}

/// The first callback credential we can use (§18.33.3, §18.36.3): AUTH_NONE
/// or AUTH_SYS; RPCSEC_GSS needs a GSS context we do not have. An empty list
/// means AUTH_NONE. None: only RPCSEC_GSS was offered.
fn callback_cred(parms: &[p::callback_sec_parms4<'_>]) -> Option<CallCred> {
    if parms.is_empty() {
        return Some(CallCred::None);
    }
    parms.iter().find_map(|s| match s {
        p::callback_sec_parms4::AUTH_NONE => Some(CallCred::None),
        p::callback_sec_parms4::AUTH_SYS(a) => Some(CallCred::Sys {
            stamp: a.stamp,
            machine_name: a.machinename[..a.machinename.len().min(rpc::backchannel::MACHINE_NAME_MAX)].to_vec(),
            uid: a.uid,
            gid: a.gid,
            gids: a.gids.iter().copied().take(16).collect(),
        }),
        p::callback_sec_parms4::RPCSEC_GSS(_) => None,
    })
}

impl Compound<'_> {
    /// SEQUENCE (RFC 8881 §18.46): find the session, apply its limits to
    /// this COMPOUND, run the slot check (§2.10.6.1), renew the lease.
    /// The negotiated sizes count the RPC header (§18.36.2), which `args`
    /// and the COMPOUND reply do not hold: the request is charged the
    /// smallest call header, the reply the reply header we send; the
    /// COMPOUND loop then answers NFS4ERR_REP_TOO_BIG or
    /// NFS4ERR_REP_TOO_BIG_TO_CACHE at the op that crosses them (§2.10.6.4).
    pub(crate) fn op_sequence(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult<Step> {
        let a = p::SEQUENCE4args::decode(d)?;
        let mut st = self.prog.state();
        let s = st.session(&a.sa_sessionid)?;
        let (fore, clientid) = (s.fore, s.clientid);
        if self.numops > fore.ops_max {
            return fail(p::NFS4ERR_TOO_MANY_OPS);
        }
        if self.request_bytes + RPC_CALL_HEADER_BYTES_MIN as usize > fore.request_bytes_max as usize {
            return fail(p::NFS4ERR_REQ_TOO_BIG);
        }
        let replay = st.sequence_begin(&a.sa_sessionid, a.sa_slotid, a.sa_sequenceid, self.conn_id, self.now_ms)?;
        // The client learns here that it must bind a back channel (§18.46.3).
        // And that delegations it held were revoked (§18.46.3, §8.2.4).
        let status_flags = st.cb_path_flags(&a.sa_sessionid) | st.revoked_flags(clientid);
        drop(st);
        self.seq = Some(Seq {
            session: a.sa_sessionid,
            slot: a.sa_slotid,
            clientid,
            cachethis: a.sa_cachethis,
            response_bytes_max: fore.response_bytes_max.saturating_sub(RPC_REPLY_HEADER_BYTES) as usize,
            response_cached_bytes_max: fore.response_cached_bytes_max.saturating_sub(RPC_REPLY_HEADER_BYTES) as usize,
        });
        if replay {
            return Ok(Step::Replay);
        }
        let highest = fore.requests_max - 1;
        p::SEQUENCE4resok {
            sr_sessionid: a.sa_sessionid,
            sr_sequenceid: a.sa_sequenceid,
            sr_slotid: a.sa_slotid,
            sr_highest_slotid: highest,
            sr_target_highest_slotid: highest,
            sr_status_flags: status_flags,
        }
        .encode(e)?;
        Ok(Step::Done)
    }

    /// EXCHANGE_ID (RFC 8881 §18.35): SP4_NONE only; the client record
    /// cases of §18.35.5 are `State::exchange_id`'s.
    pub(crate) fn op_exchange_id(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::EXCHANGE_ID4args::decode(d)?;
        if a.eia_flags & !EIA_FLAGS_ALLOWED != 0 {
            return fail(p::NFS4ERR_INVAL);
        }
        if !matches!(a.eia_state_protect, p::state_protect4_a::SP4_NONE) {
            // Machine-credential and SSV protection need RPCSEC_GSS.
            return fail(p::NFS4ERR_NOTSUPP);
        }
        let update = a.eia_flags & p::EXCHGID4_FLAG_UPD_CONFIRMED_REC_A != 0;
        let x = self.prog.state().exchange_id(
            a.eia_clientowner.co_ownerid,
            a.eia_clientowner.co_verifier,
            self.auth_uid,
            update,
            self.now_ms,
        )?;
        // A pNFS MDS says so (the Linux client enables layouts only then,
        // and refuses USE_NON_PNFS together with USE_PNFS_MDS).
        let mut flags = if self.prog.layouts.is_some() { p::EXCHGID4_FLAG_USE_PNFS_MDS } else { p::EXCHGID4_FLAG_USE_NON_PNFS };
        if x.confirmed {
            flags |= p::EXCHGID4_FLAG_CONFIRMED_R;
        }
        let cfg = &self.prog.cfg;
        p::EXCHANGE_ID4resok {
            eir_clientid: x.clientid,
            eir_sequenceid: x.sequence,
            eir_flags: flags,
            eir_state_protect: p::state_protect4_r::SP4_NONE,
            eir_server_owner: p::server_owner4 { so_minor_id: 0, so_major_id: &cfg.server_owner },
            eir_server_scope: &cfg.server_scope,
            eir_server_impl_id: Vec::new(),
        }
        .encode(e)?;
        Ok(())
    }

    /// CREATE_SESSION (RFC 8881 §18.36): fore-channel sizes and slots are
    /// negotiated down to our limits; with CONN_BACK_CHAN this connection
    /// also carries the back channel (`crate::callback`), unless the client
    /// offered only RPCSEC_GSS for it (then the flag is not granted).
    /// NFS4ERR_CLID_INUSE (another principal than the EXCHANGE_ID's),
    /// NFS4ERR_INVAL (undefined csa_flags) and NFS4ERR_TOOSMALL (channels
    /// that cannot carry a request) come from `State::create_session`.
    pub(crate) fn op_create_session(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::CREATE_SESSION4args::decode(d)?;
        let fore = attrs_in(&a.csa_fore_chan_attrs);
        let back = attrs_in(&a.csa_back_chan_attrs);
        if e.remaining() < CREATE_SESSION_RES_BYTES {
            return fail(p::NFS4ERR_RESOURCE);
        }
        let cred = callback_cred(&a.csa_sec_parms);
        let mut st = self.prog.state();
        let cs = st.create_session(
            a.csa_clientid,
            a.csa_sequence,
            self.auth_uid,
            a.csa_flags,
            cred.is_some(),
            fore,
            back,
            a.csa_cb_program,
            self.now_ms,
        )?;
        st.set_session_minor(&cs.id, self.minor)?;
        st.set_callback_sec(&cs.id, a.csa_cb_program, cred)?;
        st.bind_conn_dir(&cs.id, self.conn_id, cs.flags & p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0)?;
        drop(st);
        p::CREATE_SESSION4resok {
            csr_sessionid: cs.id,
            csr_sequence: cs.sequence,
            csr_flags: cs.flags,
            csr_fore_chan_attrs: attrs_out(&cs.fore),
            csr_back_chan_attrs: attrs_out(&cs.back),
        }
        .encode(e)?;
        Ok(())
    }

    /// BIND_CONN_TO_SESSION (RFC 8881 §18.34).
    pub(crate) fn op_bind_conn_to_session(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::BIND_CONN_TO_SESSION4args::decode(d)?;
        if a.bctsa_use_conn_in_rdma_mode {
            // RPC-over-RDMA is not wired yet; the connection stays in TCP mode.
        }
        let (back, dir) = match a.bctsa_dir {
            p::channel_dir_from_client4::CDFC4_FORE => (false, p::channel_dir_from_server4::CDFS4_FORE),
            p::channel_dir_from_client4::CDFC4_BACK => (true, p::channel_dir_from_server4::CDFS4_BACK),
            p::channel_dir_from_client4::CDFC4_FORE_OR_BOTH
            | p::channel_dir_from_client4::CDFC4_BACK_OR_BOTH => (true, p::channel_dir_from_server4::CDFS4_BOTH),
        };
        self.prog.state().bind_conn_dir(&a.bctsa_sessid, self.conn_id, back)?;
        p::BIND_CONN_TO_SESSION4resok {
            bctsr_sessid: a.bctsa_sessid,
            bctsr_dir: dir,
            bctsr_use_conn_in_rdma_mode: false,
        }
        .encode(e)?;
        Ok(())
    }

    /// BACKCHANNEL_CTL (RFC 8881 §18.33): a new callback program and
    /// credential for this session's back channel. Only RPCSEC_GSS offered:
    /// NFS4ERR_ENCR_ALG_UNSUPP (we cannot call with it).
    pub(crate) fn op_backchannel_ctl(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::BACKCHANNEL_CTL4args::decode(d)?;
        let seq = self.seq.ok_or(crate::error::Nfs4Error(p::NFS4ERR_OP_NOT_IN_SESSION))?;
        let Some(cred) = callback_cred(&a.bca_sec_parms) else { return fail(p::NFS4ERR_ENCR_ALG_UNSUPP) };
        self.prog.state().set_callback_sec(&seq.session, a.bca_cb_program, Some(cred))?;
        Ok(())
    }

    /// DESTROY_SESSION (RFC 8881 §18.37).
    pub(crate) fn op_destroy_session(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::DESTROY_SESSION4args::decode(d)?;
        self.prog.state().destroy_session(&a.dsa_sessionid)?;
        Ok(())
    }

    /// DESTROY_CLIENTID (RFC 8881 §18.50).
    pub(crate) fn op_destroy_clientid(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::DESTROY_CLIENTID4args::decode(d)?;
        self.prog.state().destroy_clientid(a.dca_clientid)?;
        Ok(())
    }

    /// RECLAIM_COMPLETE (RFC 8881 §18.51). Per-file-system completion
    /// (rca_one_fs) needs no record: reclaims are tracked per client.
    pub(crate) fn op_reclaim_complete(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::RECLAIM_COMPLETE4args::decode(d)?;
        let clientid = self.clientid()?;
        if a.rca_one_fs {
            self.cur_fh()?;
            return Ok(());
        }
        self.prog.state().reclaim_complete(clientid)?;
        Ok(())
    }
}
