import sys


def main():
    print('sunny in', sys.argv[1] if len(sys.argv) > 1 else 'nowhere')
