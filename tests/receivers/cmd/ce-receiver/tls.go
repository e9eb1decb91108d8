package main

import (
	"crypto/tls"
	"crypto/x509"
	"log"
)

// clientAuth requires client certificates signed by the CA in pem (mutual TLS).
func clientAuth(pem []byte) *tls.Config {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		log.Fatal("ce-receiver: -client-ca holds no PEM certificate")
	}
	return &tls.Config{ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
}
