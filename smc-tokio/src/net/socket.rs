//! [`SmcSocket`]: a TCP socket to configure before it connects or listens, as tokio's
//! [`TcpSocket`].

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tokio::net::TcpSocket;

use crate::net::listener::{SmcListener, SmcListenerBuilder};
use crate::net::stream::{SmcStream, SmcStreamBuilder};

/// A TCP socket that has not connected or listened yet, to set options on and bind first; a
/// drop-in for [`tokio::net::TcpSocket`].
///
/// [`connect`](SmcSocket::connect) makes an [`SmcStream`] from it (the same establishment as
/// [`SmcStream::connect`], from this socket, so its address and options are the connection's),
/// and [`listen`](SmcSocket::listen) an [`SmcListener`]. For non-default SMC settings use
/// [`SmcStreamBuilder::connect_socket`] and [`SmcListenerBuilder::listen_socket`].
///
/// # Examples
///
/// ```
/// use smc_tokio::SmcSocket;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let server = SmcSocket::new_v4()?;
/// server.set_reuseaddr(true)?;
/// server.bind("127.0.0.1:0".parse().unwrap())?;
/// let listener = server.listen(1024)?;
///
/// let client = SmcSocket::new_v4()?;
/// client.set_nodelay(true)?;
/// let stream = client.connect(listener.local_addr()?).await?;
/// let (accepted, _) = listener.accept().await?;
/// assert_eq!(stream.transport(), accepted.transport());
/// # Ok(())
/// # }
/// ```
pub struct SmcSocket {
    inner: TcpSocket,
}

impl fmt::Debug for SmcSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcSocket").field("local", &self.inner.local_addr().ok()).finish()
    }
}

impl SmcSocket {
    /// A new IPv4 TCP socket, as [`TcpSocket::new_v4`] makes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// # drop(socket);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new_v4() -> io::Result<SmcSocket> {
        Ok(SmcSocket { inner: TcpSocket::new_v4()? })
    }

    /// A new IPv6 TCP socket, as [`TcpSocket::new_v6`] makes.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v6()?;
    /// # drop(socket);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new_v6() -> io::Result<SmcSocket> {
        Ok(SmcSocket { inner: TcpSocket::new_v6()? })
    }

    /// Sets `SO_KEEPALIVE`, as [`TcpSocket::set_keepalive`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_keepalive(true)?;
    /// assert_eq!(socket.keepalive()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_keepalive(&self, value: bool) -> io::Result<()> {
        self.inner.set_keepalive(value)
    }

    /// Whether `SO_KEEPALIVE` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_keepalive(true)?;
    /// assert_eq!(socket.keepalive()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn keepalive(&self) -> io::Result<bool> {
        self.inner.keepalive()
    }

    /// Sets `SO_REUSEADDR`, as [`TcpSocket::set_reuseaddr`] does (a listener can bind an address that connections in `TIME_WAIT` still use).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_reuseaddr(true)?;
    /// assert_eq!(socket.reuseaddr()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_reuseaddr(&self, value: bool) -> io::Result<()> {
        self.inner.set_reuseaddr(value)
    }

    /// Whether `SO_REUSEADDR` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_reuseaddr(true)?;
    /// assert_eq!(socket.reuseaddr()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reuseaddr(&self) -> io::Result<bool> {
        self.inner.reuseaddr()
    }

    /// Sets `SO_REUSEPORT`, as [`TcpSocket::set_reuseport`] does. Listeners bound with it form a group that shares the port; each member gets its own door, and a same-host client registers with every member, so SMC works whichever member the kernel picks.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_reuseport(true)?;
    /// assert_eq!(socket.reuseport()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_reuseport(&self, value: bool) -> io::Result<()> {
        self.inner.set_reuseport(value)
    }

    /// Whether `SO_REUSEPORT` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_reuseport(true)?;
    /// assert_eq!(socket.reuseport()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reuseport(&self) -> io::Result<bool> {
        self.inner.reuseport()
    }

    /// Sets `SO_SNDBUF`, as [`TcpSocket::set_send_buffer_size`] does. It sizes the TCP socket's buffer; an SMC connection's rings are sized by [`ShmConfig`](crate::config::ShmConfig).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_send_buffer_size(4096)?;
    /// assert_eq!(socket.send_buffer_size()?, 8192);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_send_buffer_size(&self, value: u32) -> io::Result<()> {
        self.inner.set_send_buffer_size(value)
    }

    /// The send buffer size (`SO_SNDBUF`; Linux reports twice what was set).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_send_buffer_size(4096)?;
    /// assert_eq!(socket.send_buffer_size()?, 8192);
    /// # Ok(())
    /// # }
    /// ```
    pub fn send_buffer_size(&self) -> io::Result<u32> {
        self.inner.send_buffer_size()
    }

    /// Sets `SO_RCVBUF`, as [`TcpSocket::set_recv_buffer_size`] does; see [`set_send_buffer_size`](SmcSocket::set_send_buffer_size) for SMC.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_recv_buffer_size(4096)?;
    /// assert_eq!(socket.recv_buffer_size()?, 8192);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_recv_buffer_size(&self, value: u32) -> io::Result<()> {
        self.inner.set_recv_buffer_size(value)
    }

    /// The receive buffer size (`SO_RCVBUF`; Linux reports twice what was set).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_recv_buffer_size(4096)?;
    /// assert_eq!(socket.recv_buffer_size()?, 8192);
    /// # Ok(())
    /// # }
    /// ```
    pub fn recv_buffer_size(&self) -> io::Result<u32> {
        self.inner.recv_buffer_size()
    }

    /// Sets `TCP_NODELAY`, as [`TcpSocket::set_nodelay`] does. SMC connections send each write at once unless corked, whatever this says.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_nodelay(true)?;
    /// assert_eq!(socket.nodelay()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_nodelay(&self, value: bool) -> io::Result<()> {
        self.inner.set_nodelay(value)
    }

    /// Whether `TCP_NODELAY` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_nodelay(true)?;
    /// assert_eq!(socket.nodelay()?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nodelay(&self) -> io::Result<bool> {
        self.inner.nodelay()
    }

    /// Sets `IPV6_TCLASS` on an IPv6 socket, as [`TcpSocket::set_tclass_v6`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v6()?;
    /// socket.set_tclass_v6(96)?;
    /// assert_eq!(socket.tclass_v6()?, 96);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_tclass_v6(&self, value: u32) -> io::Result<()> {
        socket2::SockRef::from(&self.inner).set_tclass_v6(value)
    }

    /// The `IPV6_TCLASS` of an IPv6 socket.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v6()?;
    /// socket.set_tclass_v6(96)?;
    /// assert_eq!(socket.tclass_v6()?, 96);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tclass_v6(&self) -> io::Result<u32> {
        socket2::SockRef::from(&self.inner).tclass_v6()
    }

    /// Sets `IP_TOS` on an IPv4 socket, as [`TcpSocket::set_tos_v4`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_tos_v4(96)?;
    /// assert_eq!(socket.tos_v4()?, 96);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_tos_v4(&self, value: u32) -> io::Result<()> {
        socket2::SockRef::from(&self.inner).set_tos_v4(value)
    }

    /// The `IP_TOS` of an IPv4 socket.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_tos_v4(96)?;
    /// assert_eq!(socket.tos_v4()?, 96);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tos_v4(&self) -> io::Result<u32> {
        socket2::SockRef::from(&self.inner).tos_v4()
    }

    /// [`tos_v4`](Self::tos_v4) under its old name, which tokio keeps (deprecated, hidden) for
    /// code written before the rename.
    #[deprecated(note = "`tos` related methods have been renamed `tos_v4` since they are IPv4-specific.")]
    #[doc(hidden)]
    pub fn tos(&self) -> io::Result<u32> {
        self.tos_v4()
    }

    /// [`set_tos_v4`](Self::set_tos_v4) under its old name, as tokio keeps it.
    #[deprecated(note = "`tos` related methods have been renamed `set_tos_v4` since they are IPv4-specific.")]
    #[doc(hidden)]
    pub fn set_tos(&self, tos: u32) -> io::Result<()> {
        self.set_tos_v4(tos)
    }

    /// Sets `SO_LINGER`, as [`TcpSocket::set_linger`] does (deprecated there too). The stream
    /// made from the socket keeps it; see [`SmcStream::set_linger`].
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// # #[allow(deprecated)]
    /// socket.set_linger(Some(std::time::Duration::from_secs(10)))?;
    /// assert_eq!(socket.linger()?, Some(std::time::Duration::from_secs(10)));
    /// # Ok(())
    /// # }
    /// ```
    #[deprecated = "`SO_LINGER` causes the socket to block the thread on drop"]
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        socket2::SockRef::from(&self.inner).set_linger(dur)
    }

    /// Sets a zero `SO_LINGER`, as [`TcpSocket::set_zero_linger`] does: a stream made from the
    /// socket aborts its connection when dropped (see [`SmcStream::set_zero_linger`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.set_zero_linger()?;
    /// assert_eq!(socket.linger()?, Some(std::time::Duration::ZERO));
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_zero_linger(&self) -> io::Result<()> {
        socket2::SockRef::from(&self.inner).set_linger(Some(Duration::ZERO))
    }

    /// The `SO_LINGER` option, as [`TcpSocket::linger`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// assert_eq!(socket.linger()?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        self.inner.linger()
    }

    /// The device the socket is bound to (`SO_BINDTODEVICE`), as [`TcpSocket::device`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// assert_eq!(socket.device()?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn device(&self) -> io::Result<Option<Vec<u8>>> {
        self.inner.device()
    }

    /// Binds the socket to a network device (`SO_BINDTODEVICE`; needs `CAP_NET_RAW`), as
    /// [`TcpSocket::bind_device`] does; `None` removes the binding.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// // Binding to a device needs CAP_NET_RAW; removing a binding does not.
    /// socket.bind_device(None)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn bind_device(&self, interface: Option<&[u8]>) -> io::Result<()> {
        self.inner.bind_device(interface)
    }

    /// The address the socket is bound to, as [`TcpSocket::local_addr`] reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.bind("127.0.0.1:0".parse().unwrap())?;
    /// assert!(socket.local_addr()?.ip().is_loopback());
    /// # Ok(())
    /// # }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Takes the pending socket error (`SO_ERROR`), as [`TcpSocket::take_error`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// assert!(socket.take_error()?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }

    /// Binds the socket to `addr`, as [`TcpSocket::bind`] does. A client bound before it
    /// connects keeps its address: a same-host client registers this very socket at the
    /// listener's door, so binding changes nothing for SMC.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.bind("127.0.0.1:0".parse().unwrap())?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        self.inner.bind(addr)
    }

    /// Connects to `addr` and makes an [`SmcStream`], with the default settings; see
    /// [`SmcStreamBuilder::connect_socket`]. Must be called inside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::{SmcListener, SmcSocket};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let listener = SmcListener::bind("127.0.0.1:0").await?;
    /// let socket = SmcSocket::new_v4()?;
    /// socket.bind("127.0.0.1:0".parse().unwrap())?;
    /// let local = socket.local_addr()?;
    /// let stream = socket.connect(listener.local_addr()?).await?;
    /// assert_eq!(stream.local_addr()?, local);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self, addr: SocketAddr) -> io::Result<SmcStream> {
        SmcStreamBuilder::new().connect_socket(self, addr).await
    }

    /// Listens, making an [`SmcListener`] with the default settings and a backlog of
    /// `backlog`; see [`SmcListenerBuilder::listen_socket`]. Must be called inside a tokio
    /// runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// let socket = SmcSocket::new_v4()?;
    /// socket.bind("127.0.0.1:0".parse().unwrap())?;
    /// let listener = socket.listen(128)?;
    /// assert!(listener.door_name().is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn listen(self, backlog: u32) -> io::Result<SmcListener> {
        SmcListenerBuilder::new().listen_socket(self, backlog)
    }

    /// Makes a socket of a std stream's (connected or not), as
    /// [`TcpSocket::from_std_stream`] does.
    ///
    /// # Examples
    ///
    /// ```
    /// use smc_tokio::SmcSocket;
    ///
    /// # fn main() -> std::io::Result<()> {
    /// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let std_stream = std::net::TcpStream::connect(listener.local_addr()?)?;
    /// let socket = SmcSocket::from_std_stream(std_stream);
    /// # drop(socket);
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_std_stream(stream: std::net::TcpStream) -> SmcSocket {
        SmcSocket { inner: TcpSocket::from_std_stream(stream) }
    }

    /// The socket, for the establishment to bind, register and connect.
    pub(crate) fn into_socket2(self) -> socket2::Socket {
        // SAFETY: into_raw_fd hands over the descriptor it owned; the Socket now owns it.
        unsafe { socket2::Socket::from_raw_fd(self.inner.into_raw_fd()) }
    }

    /// The tokio socket, to listen on.
    pub(crate) fn into_tokio(self) -> TcpSocket {
        self.inner
    }
}

impl AsFd for SmcSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for SmcSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl IntoRawFd for SmcSocket {
    fn into_raw_fd(self) -> RawFd {
        self.inner.into_raw_fd()
    }
}

impl FromRawFd for SmcSocket {
    /// # Safety
    ///
    /// `fd` must be an open TCP socket that nothing else owns, as for
    /// [`TcpSocket::from_raw_fd`].
    unsafe fn from_raw_fd(fd: RawFd) -> SmcSocket {
        // SAFETY: the caller promises an owned, open TCP socket.
        SmcSocket { inner: unsafe { TcpSocket::from_raw_fd(fd) } }
    }
}

impl From<OwnedFd> for SmcSocket {
    /// Takes an open TCP socket.
    fn from(fd: OwnedFd) -> SmcSocket {
        // SAFETY: an OwnedFd owns its descriptor, which moves into the socket.
        unsafe { SmcSocket::from_raw_fd(fd.into_raw_fd()) }
    }
}
