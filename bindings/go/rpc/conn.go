package rpc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// RemoteError is an ERROR frame: the exception the peer raised (the session stays usable unless its request
// id was 0).
type RemoteError struct {
	Type, Message, Traceback string
}

func (e *RemoteError) Error() string { return "tether/rpc: remote " + e.Type + ": " + e.Message }

// TimeoutError: a wait ran out (connect, a reply, bulk bytes).
type TimeoutError struct{ What string }

func (e *TimeoutError) Error() string { return "tether/rpc: timed out " + e.What }
func (e *TimeoutError) Timeout() bool { return true }

func remoteError(p *Map) *RemoteError {
	s := func(k string) string {
		v, _ := p.Get(k)
		str, _ := v.(string)
		return str
	}
	return &RemoteError{Type: s("type"), Message: s("message"), Traceback: s("traceback")}
}

// framedConn reads and writes frames and bulk bytes on one TCP connection; every read has a deadline.
type framedConn struct {
	c      net.Conn
	buf    []byte // received, not yet consumed
	limits Limits
}

func dial(addr string, timeout time.Duration) (*framedConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("tether/rpc: cannot connect to %s: %w", addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return &framedConn{c: c, limits: HandshakeLimits}, nil
}

func (f *framedConn) send(msgType int, rid int64, payload *Map, bulk []byte, timeout time.Duration) error {
	frame, err := EncodeFrame(msgType, rid, payload)
	if err != nil {
		return err
	}
	_ = f.c.SetWriteDeadline(time.Now().Add(timeout))
	if len(bulk) > 0 && len(bulk) < 64<<10 { // one write: a header on its own would meet delayed ACK
		frame = append(frame, bulk...)
		bulk = nil
	}
	if len(bulk) > 0 {
		bufs := net.Buffers{frame, bulk}
		_, err = bufs.WriteTo(f.c)
	} else {
		_, err = f.c.Write(frame)
	}
	return f.ioError(err, "sending a frame")
}

func (f *framedConn) ioError(err error, what string) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &TimeoutError{What: what}
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("tether/rpc: the peer closed the connection while %s", what)
	}
	return fmt.Errorf("tether/rpc: %s: %w", what, err)
}

func (f *framedConn) fill(deadline time.Time, what string) error {
	_ = f.c.SetReadDeadline(deadline)
	var chunk [64 << 10]byte
	n, err := f.c.Read(chunk[:])
	f.buf = append(f.buf, chunk[:n]...)
	if n > 0 {
		return nil
	}
	return f.ioError(err, what)
}

func (f *framedConn) readFrame(timeout time.Duration) (*Frame, error) {
	deadline := time.Now().Add(timeout)
	for {
		fr, n, err := ParseFrame(f.buf, f.limits)
		if err == nil {
			f.buf = f.buf[n:]
			return fr, nil
		}
		if !errors.Is(err, ErrIncomplete) {
			return nil, err
		}
		if err := f.fill(deadline, "waiting for a frame"); err != nil {
			return nil, err
		}
	}
}

// readBulk reads exactly n raw bytes that follow a frame.
func (f *framedConn) readBulk(n int64, timeout time.Duration) ([]byte, error) {
	if n > f.limits.MaxBulk {
		return nil, &FrameTooLarge{Msg: fmt.Sprintf("bulk payload of %d bytes exceeds the limit of %d", n, f.limits.MaxBulk)}
	}
	out := make([]byte, n)
	k := copy(out, f.buf)
	f.buf = f.buf[k:]
	if k < len(out) {
		_ = f.c.SetReadDeadline(time.Now().Add(timeout))
		if _, err := io.ReadFull(f.c, out[k:]); err != nil {
			return nil, f.ioError(err, "reading bulk bytes")
		}
	}
	return out, nil
}

func (f *framedConn) close() error { return f.c.Close() }

// endpoint is the client side of one framed connection (a device session, a tracker link): requests take
// numbered ids under mu, and the connection ends once.
type endpoint struct {
	mu     sync.Mutex
	conn   *framedConn
	nextID int64
	closed bool
}

// end closes the connection unless it is closed already (idempotent), after goodbye, if any, has run.
func (e *endpoint) end(goodbye func()) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if goodbye != nil {
		goodbye()
	}
	return e.conn.close()
}

// abort closes the connection after an error that leaves its stream unusable (mu held); later requests are
// refused.
func (e *endpoint) abort() {
	e.closed = true
	e.conn.close()
}

// handshakeTypes: the core protocol's and the tracker's handshakes differ only in their message types.
type handshakeTypes struct{ hello, challenge, auth, welcome int }

var coreHandshake = handshakeTypes{MsgHello, MsgChallenge, MsgAuth, MsgWelcome}

const nonceSize = 32

func mac(token string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, []byte(token))
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// handshake sends hello and answers CHALLENGE with AUTH (HMAC-SHA256 over both nonces), then checks WELCOME's
// proof of the token (docs/protocol.md "Handshake"). EVENTs (queued) are passed to onEvent.
func (f *framedConn) handshake(types handshakeTypes, hello *Map, token, peer string, timeout time.Duration,
	onEvent func(*Map)) (*Map, error) {
	if err := f.send(types.hello, 0, hello, nil, timeout); err != nil {
		return nil, err
	}
	var serverNonce, clientNonce []byte
	for {
		fr, err := f.readFrame(timeout)
		if err != nil {
			return nil, err
		}
		switch {
		case fr.Type == types.challenge && serverNonce == nil:
			if token == "" {
				return nil, fmt.Errorf("tether/rpc: %s requires a token: pass Options.Token", peer)
			}
			n, _ := fr.Payload.Get("nonce")
			nb, ok := n.([]byte)
			if !ok || len(nb) != nonceSize {
				return nil, &ProtocolError{Msg: peer + " sent a CHALLENGE without a 32-byte nonce"}
			}
			serverNonce = nb
			clientNonce = make([]byte, nonceSize)
			if _, err := rand.Read(clientNonce); err != nil {
				return nil, err
			}
			auth := NewMap("nonce", clientNonce, "mac", mac(token, []byte("tether-auth-v1/client"), serverNonce, clientNonce))
			if err := f.send(types.auth, 0, auth, nil, timeout); err != nil {
				return nil, err
			}
		case fr.Type == types.welcome:
			if token != "" {
				if serverNonce == nil {
					return nil, fmt.Errorf("tether/rpc: %s did not ask for the token this side holds, so it cannot prove it is genuine", peer)
				}
				p, _ := fr.Payload.Get("proof")
				pb, _ := p.([]byte)
				if !hmac.Equal(pb, mac(token, []byte("tether-auth-v1/server"), clientNonce, serverNonce)) {
					return nil, fmt.Errorf("tether/rpc: %s did not prove it knows the token", peer)
				}
			}
			return fr.Payload, nil
		case fr.Type == MsgError:
			return nil, remoteError(fr.Payload)
		case fr.Type == MsgEvent:
			if onEvent != nil {
				onEvent(fr.Payload)
			}
		default:
			return nil, &ProtocolError{Msg: fmt.Sprintf("%s sent message type %d during the handshake", peer, fr.Type)}
		}
	}
}
