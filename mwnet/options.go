package mwnet

import (
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Option configures Listen, Dial and Dialer.
type Option func(*options)

type options struct {
	device verbs.Device
	config transport.Config
}

// WithDevice carries the queue pairs on dev (ibv, for example) instead of a soft NIC of
// the conn's own. The device stays the caller's: close it after every Conn and Listener
// using it.
func WithDevice(dev verbs.Device) Option { return func(o *options) { o.device = dev } }

// WithCredentials secures each connection's setup (TLS, for example); Conn.AuthInfo then
// returns what the handshake established about the peer.
func WithCredentials(c credentials.TransportCredentials) Option {
	return func(o *options) { o.config.Credentials = c }
}

// WithTransport sets the transport's configuration (windows, message and pool limits);
// credentials given with WithCredentials are kept.
func WithTransport(cfg transport.Config) Option {
	return func(o *options) {
		creds := o.config.Credentials
		o.config = cfg
		if cfg.Credentials == nil {
			o.config.Credentials = creds
		}
	}
}

func collect(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
