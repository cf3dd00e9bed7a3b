    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'platformkit: a parameter is out of bounds';
END IF;
