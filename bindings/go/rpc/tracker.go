package rpc

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Tracker message types (docs/tracker.md) used by a client.
const (
	trackerHello     = 64
	trackerChallenge = 65
	trackerAuth      = 66
	trackerWelcome   = 67
	trackerRequest   = 80
	trackerQueued    = 81
	trackerGrant     = 82
	trackerSummary   = 83
	trackerSummaryRe = 84
	trackerCancel    = 85
)

// grantGrace is how long past wait_timeout the client waits for the tracker's own verdict.
const grantGrace = 5 * time.Second

// Tracker is a client connection to an rpc-tracker. Close is idempotent.
type Tracker struct {
	endpoint
	addr string
	// SessionToken is the token of the devices' own servers (Options.Token of the sessions opened by Request).
	SessionToken string
	Timeout      time.Duration
}

// ConnectTracker opens a client connection to the tracker at addr with its token ("" for none).
func ConnectTracker(addr, token string, timeout time.Duration) (*Tracker, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	c, err := dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	hello := NewMap("magic", "tether-tracker", "version", 1, "role", "client", "name", "tether-go")
	types := handshakeTypes{trackerHello, trackerChallenge, trackerAuth, trackerWelcome}
	if _, err := c.handshake(types, hello, token, "the tracker at "+addr, timeout, nil); err != nil {
		c.close()
		return nil, err
	}
	c.limits = DefaultLimits
	return &Tracker{endpoint: endpoint{conn: c, nextID: 1}, addr: addr, Timeout: timeout}, nil
}

// Close ends the tracker connection (withdrawing any queued request); idempotent.
func (t *Tracker) Close() error {
	return t.end(nil)
}

// Grant is the tracker's answer to a request: where to connect, with which one-time match token.
type Grant struct {
	Host   string
	Port   int64 // 0: connect to the tracker itself (relay)
	Match  string
	Key    string
	Device int64
	Relay  bool
}

// Reserve waits (at most waitTimeout) for a device matching key (a key, a glob or tags) and returns its grant.
func (t *Tracker) Reserve(key string, priority float64, waitTimeout, sessionTimeout time.Duration,
	onQueued func(*Map)) (*Grant, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	req := NewMap("key", key, "priority", priority, "wait_timeout", waitTimeout.Seconds(),
		"session_timeout", sessionTimeout.Seconds())
	rid, err := t.send(trackerRequest, req)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(waitTimeout + grantGrace)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			_ = t.conn.send(trackerCancel, rid, NewMap(), nil, time.Second)
			return nil, &TimeoutError{What: fmt.Sprintf("waiting for the tracker at %s to grant %q", t.addr, key)}
		}
		fr, err := t.conn.readFrame(left)
		if err != nil {
			if _, ok := err.(*TimeoutError); ok {
				continue // the loop's deadline check cancels and reports
			}
			t.abort()
			return nil, err
		}
		if fr.RequestID != rid {
			continue // a late answer to an earlier, abandoned request
		}
		switch fr.Type {
		case trackerGrant:
			g := &Grant{}
			g.Match, _ = field[string](fr.Payload, "match", "GRANT")
			if g.Match == "" {
				return nil, &ProtocolError{Msg: "GRANT without a match token"}
			}
			if h, ok := fr.Payload.Get("host"); ok {
				g.Host, _ = h.(string)
			}
			if p, ok := fr.Payload.Get("port"); ok {
				g.Port, _ = p.(int64)
			}
			g.Key, _ = field[string](fr.Payload, "key", "GRANT")
			g.Device, _ = field[int64](fr.Payload, "device", "GRANT")
			g.Relay, _ = field[bool](fr.Payload, "relay", "GRANT")
			return g, nil
		case trackerQueued:
			if onQueued != nil {
				onQueued(fr.Payload)
			}
		case MsgError:
			return nil, remoteError(fr.Payload)
		default:
			t.abort()
			return nil, &ProtocolError{Msg: fmt.Sprintf("the tracker answered REQUEST with message type %d", fr.Type)}
		}
	}
}

// send sends a request under a fresh request id and returns the id (t.mu held). A failed send aborts the
// connection: a partly written frame leaves the stream unusable.
func (t *Tracker) send(msgType int, payload *Map) (int64, error) {
	if t.closed {
		return 0, fmt.Errorf("tether/rpc: the tracker connection to %s is closed", t.addr)
	}
	rid := t.nextID
	t.nextID++
	if err := t.conn.send(msgType, rid, payload, nil, t.Timeout); err != nil {
		t.abort()
		return 0, err
	}
	return rid, nil
}

// Request reserves a device and opens a session on it (through the tracker's relay when the grant says so).
// opts.Token defaults to t.SessionToken.
func (t *Tracker) Request(key string, priority float64, waitTimeout, sessionTimeout time.Duration,
	opts Options) (*Session, error) {
	g, err := t.Reserve(key, priority, waitTimeout, sessionTimeout, nil)
	if err != nil {
		return nil, err
	}
	trackerHost, trackerPort, _ := net.SplitHostPort(t.addr)
	host, port := g.Host, strconv.FormatInt(g.Port, 10)
	if host == "" {
		host = trackerHost
	}
	if g.Port == 0 {
		port = trackerPort
	}
	if opts.Token == "" {
		opts.Token = t.SessionToken
	}
	opts.Match = g.Match
	return Connect(net.JoinHostPort(host, port), opts)
}

// Summary returns the tracker's view: devices and queues.
func (t *Tracker) Summary() (*Map, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rid, err := t.send(trackerSummary, NewMap())
	if err != nil {
		return nil, err
	}
	for {
		fr, err := t.conn.readFrame(t.Timeout)
		if err != nil {
			t.abort()
			return nil, err
		}
		if fr.RequestID != rid {
			continue
		}
		if fr.Type == MsgError {
			return nil, remoteError(fr.Payload)
		}
		if fr.Type != trackerSummaryRe {
			t.abort()
			return nil, &ProtocolError{Msg: fmt.Sprintf("the tracker answered SUMMARY with message type %d", fr.Type)}
		}
		return fr.Payload, nil
	}
}
