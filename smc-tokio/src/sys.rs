//! The few raw system calls the driver needs.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::proto::clc::Token;

/// A random connection token from the kernel's CSPRNG (getrandom(2)).
pub(crate) fn random_token() -> io::Result<Token> {
    let mut t = [0u8; 16];
    let mut filled = 0;
    while filled < t.len() {
        let rest = &mut t[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the whole call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(Token(t))
}

/// `recv(fd, buf, MSG_PEEK | MSG_DONTWAIT)`: the bytes waiting, without taking them and without
/// blocking (`WouldBlock` when there are none).
pub(crate) fn peek_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and `fd` is an open socket
        // borrowed for the duration of the call.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token().unwrap(), random_token().unwrap());
    }
}
