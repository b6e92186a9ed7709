package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// build is the TLS configuration for clients, or nil when TLS is off.
func (t serverTLS) build() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCAFile != "" {
		if cfg.ClientCAs, err = certPool(t.ClientCAFile); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if t.RequireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert // validate made sure of the CA
	}
	return cfg, nil
}

// build is the TLS configuration for connecting to the backend or the lock
// nodes, or nil when TLS is off.
func (c clientTLS) build() (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	t := &tls.Config{ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		var err error
		if t.RootCAs, err = certPool(c.CAFile); err != nil {
			return nil, err
		}
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// certPool reads the PEM certificates in path.
func certPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate found", path)
	}
	return pool, nil
}
