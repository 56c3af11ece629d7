package main

// The kubelet plugin-registration API (k8s.io/kubelet/pkg/apis/pluginregistration/v1,
// service pluginregistration.Registration). Its two messages are tiny, so they
// are encoded here with protowire instead of importing the kubelet module into
// ours: PluginInfo{1 type, 2 name, 3 endpoint, 4 repeated supported_versions},
// RegistrationStatus{1 plugin_registered, 2 error}, empty requests/responses.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
)

const (
	registrationDir = "/registration"
	// csiSupportedVersion is what the kubelet's CSI plugin handler accepts.
	csiSupportedVersion = "1.0.0"
	// registrationMsgMax bounds what the kubelet may send us.
	registrationMsgMax = 64 << 10
)

// rawMsg carries already-encoded protobuf bytes through gRPC.
type rawMsg struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return m.b, nil
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	if len(data) > registrationMsgMax {
		return fmt.Errorf("rawCodec: message of %d bytes exceeds %d", len(data), registrationMsgMax)
	}
	m.b = append([]byte(nil), data...)
	return nil
}

var _ encoding.Codec = rawCodec{}

func encodePluginInfo(name, endpoint string) []byte {
	var b []byte
	for _, f := range []struct {
		num protowire.Number
		s   string
	}{{1, "CSIPlugin"}, {2, name}, {3, endpoint}, {4, csiSupportedVersion}} {
		b = protowire.AppendTag(b, f.num, protowire.BytesType)
		b = protowire.AppendString(b, f.s)
	}
	return b
}

// decodeRegistrationStatus reads RegistrationStatus, skipping unknown fields.
func decodeRegistrationStatus(b []byte) (registered bool, msg string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false, "", protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false, "", protowire.ParseError(n)
			}
			registered, b = v != 0, b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return false, "", protowire.ParseError(n)
			}
			msg, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false, "", protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return registered, msg, nil
}

type registrationServer struct {
	name, endpoint string
	status         chan error
}

func (s *registrationServer) desc() *grpc.ServiceDesc {
	unary := func(h func(req []byte) ([]byte, error)) grpc.MethodHandler {
		return func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := &rawMsg{}
			if err := dec(in); err != nil {
				return nil, err
			}
			out, err := h(in.b)
			if err != nil {
				return nil, err
			}
			return &rawMsg{b: out}, nil
		}
	}
	return &grpc.ServiceDesc{
		ServiceName: "pluginregistration.Registration",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "GetInfo", Handler: unary(func([]byte) ([]byte, error) {
				log.Printf("registrar stand-in: kubelet asked GetInfo: %s at %s", s.name, s.endpoint)
				return encodePluginInfo(s.name, s.endpoint), nil
			})},
			{MethodName: "NotifyRegistrationStatus", Handler: unary(func(req []byte) ([]byte, error) {
				ok, msg, err := decodeRegistrationStatus(req)
				if err != nil {
					return nil, err
				}
				if ok {
					log.Printf("registrar stand-in: kubelet registered %s", s.name)
					if err := os.WriteFile(registrationStatusFile, []byte("registered\n"), 0o644); err != nil {
						return nil, err
					}
					s.status <- nil
				} else {
					s.status <- fmt.Errorf("kubelet refused the registration of %s: %s", s.name, msg)
				}
				return nil, nil
			})},
		},
		Streams: []grpc.StreamDesc{},
	}
}

func runRegistrar(ctx context.Context, csiAddress, regPath string, timeout time.Duration) error {
	if regPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	conn, err := dialCSI(csiAddress)
	if err != nil {
		return err
	}
	name, err := waitForDriver(ctx, conn, timeout)
	conn.Close()
	if err != nil {
		return err
	}
	sock := filepath.Join(registrationDir, name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing a stale %s: %w", sock, err)
	}
	_ = os.Remove(registrationStatusFile)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	rs := &registrationServer{name: name, endpoint: regPath, status: make(chan error, 4)}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(registrationMsgMax))
	srv.RegisterService(rs.desc(), rs)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-rs.status:
				if err != nil {
					// As the real registrar: a refused registration is fatal,
					// the restart retries it.
					log.Printf("registrar stand-in: %v", err)
					srv.Stop()
				}
			}
		}
	}()
	go func() { <-ctx.Done(); srv.Stop() }()
	log.Printf("registrar stand-in: serving %s for driver %s (endpoint %s)", sock, name, regPath)
	err = srv.Serve(lis)
	_ = os.Remove(sock)
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("registration refused by the kubelet")
	}
	return err
}

// registrationProbe is the chart's liveness probe: healthy once the kubelet
// confirmed the registration.
func registrationProbe() error {
	if _, err := os.Stat(registrationStatusFile); err != nil {
		return fmt.Errorf("the kubelet has not confirmed the registration (%v)", err)
	}
	fmt.Println("registered")
	return nil
}
