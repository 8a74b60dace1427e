package workload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// SelfSigned is an in-process generated ECDSA P-256 certificate that is its
// own CA.
type SelfSigned struct {
	// Cert is ready for tls.Config.Certificates.
	Cert tls.Certificate
	// Pool trusts Cert, for a client's tls.Config.RootCAs.
	Pool *x509.CertPool
	// CertPEM is the certificate in PEM, for a client in another process.
	CertPEM []byte
}

// NewSelfSigned generates a self-signed certificate valid for localhost,
// 127.0.0.1, ::1 and the given extra host names or IP addresses.
func NewSelfSigned(hosts ...string) (*SelfSigned, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "lattrace workload", Organization: []string{"lattrace"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &SelfSigned{
		Cert:    tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		Pool:    pool,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

// clientTLSConfig returns the TLS config a client uses for addr: conf if
// given (ServerName filled from addr when unset), otherwise one that skips
// verification.
func clientTLSConfig(conf *tls.Config, addr string) *tls.Config {
	if conf == nil {
		return &tls.Config{InsecureSkipVerify: true}
	}
	if conf.ServerName == "" && !conf.InsecureSkipVerify {
		conf = conf.Clone()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			conf.ServerName = host
		}
	}
	return conf
}
